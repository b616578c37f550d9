"""Encode and decode text with a GPT-1 vocabulary, or train a new vocabulary.

Examples:
  echo "Hello, world!" | gpt1 tokenizer encode --vocab gpt1_tokenizer
  echo "3570 240 1276 267" | gpt1 tokenizer decode --vocab runs/mini/final
  gpt1 tokenizer train --corpus data/books/ --merges 8000 --out vocab8k/

encode: one line of space-separated ids per input line (an empty line for an empty one).
decode: the text of each line of ids, then a newline (the newline token decodes to a newline
too). --vocab takes a folder with vocab.json + merges.txt
(a checkpoint or prepared-data folder) or the original encoder_bpe_40000.json + vocab_40000.bpe.
"""

from __future__ import annotations

import argparse
import io
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

HELP = "encode/decode text with a GPT-1 vocabulary; train a new vocabulary"
BATCH_LINES = 4096


DESCRIPTIONS = {
    "encode": "Read text lines from standard input and write one line of space-separated token ids "
    "per input line (an empty line for an empty one), with the GPT-1 pipeline: ftfy, "
    "text standardisation, spaCy, lowercase, BPE.\n\n"
    'Example:\n  echo "Hello, world!" | gpt1 tokenizer encode --vocab gpt1_tokenizer',
    "decode": "Read lines of space-separated token ids from standard input and write one line of "
    "text per line (word pieces joined, </w> read as a space except at the end; the newline token "
    "writes a newline), as the transformers export's tokenizer decodes them.\n\n"
    'Example:\n  echo "3570 240 1276 267" | gpt1 tokenizer decode --vocab runs/mini/final',
    "train": "Learn a new BPE vocabulary from .txt/.jsonl/.parquet files with the GPT-1 pipeline and write "
    "vocab.json + merges.txt (the layout every other command reads).\n\n"
    "Example:\n  gpt1 tokenizer train --corpus data/books/ --merges 8000 --out vocab8k/",
}


def _sub(sub: argparse._SubParsersAction, name: str, help_: str) -> argparse.ArgumentParser:
    """A subcommand with its description and the options every command has (--debug, --quiet)."""
    import textwrap

    from gpt1.cli import options

    summary, example = DESCRIPTIONS[name].split("\n\n", 1)
    return sub.add_parser(
        name,
        help=help_,
        description=textwrap.fill(summary, 79) + "\n\n" + example,
        parents=[options.common_options()],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_ in (
        ("encode", "stdin text lines -> id lines"),
        ("decode", "stdin id lines -> text lines"),
    ):
        q = _sub(sub, name, help_)
        q.add_argument(
            "--vocab",
            required=True,
            type=Path,
            metavar="DIR",
            help="folder with the tokenizer files",
        )
        options.add_standardize(q)
        if name == "encode":
            q.add_argument("--processes", type=int, default=1, help="worker processes")
            options.add_oai_lowercase(q)
    _add_train(_sub(sub, "train", "learn a new BPE vocabulary with the GPT-1 pipeline"))


def _add_train(t: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    options.add_corpus(t, ".txt/.jsonl/.parquet files or folders")
    t.add_argument("--merges", type=int, required=True, help="number of BPE merges to learn")
    t.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="writes vocab.json + merges.txt here"
    )
    t.add_argument("--min-frequency", type=int, default=0, help="ignore rarer pairs")
    options.add_standardize(t)
    options.add_corpus_fields(t)
    t.add_argument("--processes", type=int, default=1, help="worker processes for counting")
    options.add_oai_lowercase(t)
    options.add_overwrite(t, "a non-empty --out")


def run(args: argparse.Namespace) -> int:
    processes = getattr(args, "processes", 1)
    if processes < 1:
        from gpt1.errors import ConfigError

        raise ConfigError(f"--processes must be >= 1, got {processes}")
    if args.action == "train":
        return _train(args)
    from gpt1.cli import options
    from gpt1.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(args.vocab, **options.text_settings(args))
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n")
    lines = (line.rstrip("\n") for line in stdin)
    out = (
        encode_lines(tok, lines, args.processes)
        if args.action == "encode"
        else decode_lines(tok, lines)
    )
    write = sys.stdout.write
    for line in out:
        write(line + "\n")
    sys.stdout.flush()
    return 0


def encode_lines(tok, lines: Iterator[str], processes: int = 1) -> Iterator[str]:
    """Each text line -> its ids, space-separated (batches keep memory bounded)."""
    while batch := list(itertools.islice(lines, BATCH_LINES)):
        for ids in tok.encode_batch(batch, processes=processes):
            yield " ".join(map(str, ids))


def decode_lines(tok, lines: Iterator[str], source: str = "<stdin>") -> Iterator[str]:
    """Each line of space-separated ids -> text; bad ids name the line."""
    from gpt1.errors import DataError

    for lineno, line in enumerate(lines, start=1):
        try:
            ids = [int(x) for x in line.split()]
        except ValueError:
            raise DataError(
                f"expected space-separated integer ids, got {line[:60]!r}", source, lineno
            ) from None
        try:
            yield tok.decode(ids)
        except DataError as exc:
            raise DataError(exc.reason, source, lineno) from None


def _train(args: argparse.Namespace) -> int:
    from gpt1.cli import options
    from gpt1.text.prepare import PrepareOptions, train_tokenizer

    settings = options.corpus_settings(args)
    opts = PrepareOptions(workers=args.processes, overwrite=args.overwrite, **settings)
    train_tokenizer(args.corpus, args.merges, args.out, opts, args.min_frequency)
    return 0
