"""Encode a text corpus into token shards for `gpt1 pretrain`.

Examples:
  gpt1 prepare --corpus gutenberg/ --strip-gutenberg \\
      --vocab gpt1_tokenizer --out data/gutenberg --workers 2
  gpt1 prepare --corpus books.jsonl --text-field text --vocab vocab8k --out data/books
  gpt1 prepare --corpus hub:SOME/bookcorpus --vocab ... --out ...   (needs `datasets`, online)

A .txt file is one document unless --doc-sep says otherwise ("blank-line": paragraphs, "line":
lines, or any literal string); .jsonl and .parquet rows give one document each. Folders are walked
recursively (sorted). Documents go to the validation split at random (fixed by --seed), at
least one when there are two or more. OUT receives meta.json, train-*.bin, val-*.bin and the
tokenizer's vocab.json + merges.txt; it is written under a temporary name and renamed at the end.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "encode .txt/.jsonl/.parquet corpora into token shards (train/val split by document)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    options.add_corpus(p, ".txt/.jsonl/.parquet files, folders, or hub:NAME[:SPLIT]")
    p.add_argument(
        "--vocab",
        type=Path,
        required=True,
        metavar="DIR",
        help="tokenizer folder (vocab.json + merges.txt or the original files)",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder to create (meta.json, token shards, vocab.json + merges.txt)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.005,
        help="fraction of documents held out for validation (default 0.005)",
    )
    p.add_argument("--seed", type=int, default=1234, help="seed of the validation choice")
    p.add_argument(
        "--doc-sep",
        default=None,
        help='split .txt files into documents: "blank-line", "line" or a string',
    )
    options.add_corpus_fields(p)
    p.add_argument("--workers", type=int, default=1, help="encoding processes")
    p.add_argument(
        "--shard-tokens",
        type=int,
        default=100_000_000,
        help="tokens per shard (approximate; documents are not cut)",
    )
    options.add_standardize(p, help_names_default=False)
    options.add_oai_lowercase(p)
    options.add_overwrite(p, "a non-empty --out")


def run(args: argparse.Namespace) -> int:
    from gpt1.cli import options
    from gpt1.errors import DataError
    from gpt1.text.prepare import PrepareOptions, prepare

    if not 0 <= args.val_fraction < 1:
        raise DataError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.workers < 1 or args.shard_tokens < 1:
        raise DataError("--workers and --shard-tokens must be at least 1")
    opts = options.from_flags(PrepareOptions, args, **options.text_settings(args))
    meta = prepare(args.corpus, args.vocab, args.out, opts)
    stats, splits = meta["stats"], meta["splits"]
    print(
        f"{stats['documents']:,} documents, {stats['tokens']:,} tokens "
        f"(train {splits['train']['tokens']:,} in {splits['train']['documents']:,} docs, "
        f"val {splits['val']['tokens']:,} in {splits['val']['documents']:,} docs), "
        f"{meta['dtype']}, {stats['seconds']:.1f} s -> {args.out}"
    )
    skipped = len(stats["skipped_empty"]) + len(stats["skipped_binary"])
    if skipped or stats["invalid_utf8_replaced"]:
        print(
            f"skipped files: {skipped} (empty {len(stats['skipped_empty'])}, binary "
            f"{len(stats['skipped_binary'])}); invalid UTF-8 sequences replaced: "
            f"{stats['invalid_utf8_replaced']}"
        )
    return 0
