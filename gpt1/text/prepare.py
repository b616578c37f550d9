"""Corpus preparation: text files (or a hub dataset) -> token shards for pretraining.

`prepare()` reads `.txt` / `.jsonl` files and folders, encodes every document with the GPT-1
tokenizer (several processes), splits train/validation by document and writes, into OUT:

    meta.json                 {"format": "gpt1-tokens", "version": 1, "vocab_size", "dtype",
                               "splits": {"train"|"val": {"shards", "tokens", "documents"}},
                               "sources", "stats"}
    train-00000.bin ...       token shards (gpt1.text.shards), documents concatenated, no separator
    val-00000.bin ...
    vocab.json, merges.txt    the tokenizer, so training and checkpoints know the vocabulary

The folder is built under a temporary name and renamed when complete, so an interrupted run
leaves no half-written OUT. Bad input is counted, not fatal, where it can be: invalid UTF-8 is
replaced, empty and binary files are skipped with a warning; malformed JSON lines are errors
naming the file and line.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import random
import re
import signal
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpt1.errors import DataError
from gpt1.extras import require
from gpt1.files import not_a_data_path
from gpt1.text.pool import open_pool
from gpt1.text.shards import ShardAppender, dtype_for_vocab
from gpt1.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FORMAT, VERSION = "gpt1-tokens", 1
EXTENSIONS = (".txt", ".jsonl", ".parquet")
DOC_SEPS = {"blank-line": re.compile(r"\n[^\S\n]*\n\s*"), "line": re.compile(r"\n")}
_GUTENBERG_START = re.compile(
    r"^\*\*\*\s*START OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK.*$", re.IGNORECASE | re.MULTILINE
)
_GUTENBERG_END = re.compile(
    r"^\*\*\*\s*END OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK", re.IGNORECASE | re.MULTILINE
)


@dataclass
class PrepareOptions:
    """How to read and split the corpus (the `gpt1 prepare` flags)."""

    val_fraction: float = 0.005
    seed: int = 1234
    doc_sep: str | None = None  # None: a .txt file is one document
    text_field: str = "text"  # the field of a .jsonl row that holds the text
    strip_gutenberg: bool = False
    workers: int = 1
    shard_tokens: int = 100_000_000  # a shard is closed after the document that passes this
    max_line_bytes: int = 64 << 20  # longer .jsonl lines are refused (a missing newline?)
    overwrite: bool = False
    quiet: bool = False
    standardize: str = "oai"
    lower_first: bool = True  # False: OAI's order (see gpt1.text.tokenizer.Tokenizer)


@dataclass
class Stats:
    files: int = 0
    skipped_empty: list[str] = field(default_factory=list)
    skipped_binary: list[str] = field(default_factory=list)
    invalid_utf8_replaced: int = 0
    gutenberg_stripped: int = 0
    gutenberg_markers_missing: int = 0
    empty_documents: int = 0


# ---------------------------------------------------------------------------------------------
# Reading
@dataclass(frozen=True)
class HubSource:
    """A Hugging Face hub dataset, named on the command line as hub:NAME[:SPLIT]."""

    name: str
    split: str = "train"

    def __str__(self) -> str:
        return f"hub:{self.name}:{self.split}"


def find_files(corpus: Sequence[str | Path]) -> list[Path | HubSource]:
    """The files named or found (recursively, sorted) under the folders named, and hub:NAME
    datasets."""
    files: list[Path | HubSource] = []
    for item in corpus:
        if isinstance(item, str) and item.startswith("hub:"):
            name, _, split = item[4:].partition(":")
            files.append(HubSource(name, split or "train"))
            continue
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in EXTENSIONS)
            if not found:
                raise DataError("folder holds no .txt, .jsonl or .parquet files", path)
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            problem = not_a_data_path(path)
            if problem == "no such file or folder":
                problem += " (for a hub dataset write hub:NAME)"
            raise DataError(problem, path)
    return files


def _count_errors(exc: UnicodeDecodeError) -> tuple[str, int]:
    _DECODE_ERRORS[0] += 1
    return "\ufffd", exc.end


_DECODE_ERRORS = [0]
codecs.register_error("gpt1-count", _count_errors)


def _skip_file(path: Path, stats: Stats | None) -> bool:
    """True for an empty or binary file (warned and counted unless `stats` is None)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8192)
        size = path.stat().st_size
    except OSError as exc:
        raise DataError(f"cannot read ({exc.strerror})", path) from None
    # whitespace-only files larger than the head are caught after reading (read_text)
    empty = size <= len(head) and not head.strip()
    if empty or b"\0" in head:
        if stats is not None:
            log.warning("%s: %s file, skipped", path, "empty" if empty else "binary (NUL bytes)")
            (stats.skipped_empty if empty else stats.skipped_binary).append(str(path))
        return True
    return False


def _count_replaced(path: Path, replaced: int, stats: Stats | None) -> None:
    if replaced and stats is not None:
        log.warning("%s: %d invalid UTF-8 sequences replaced by U+FFFD", path, replaced)
        stats.invalid_utf8_replaced += replaced


def read_text(path: Path, stats: Stats | None) -> str | None:
    """A file's text (BOM dropped, invalid UTF-8 replaced and counted), or None when the file
    is empty or binary (warned and counted; `stats=None`: silently, for a second pass)."""
    if _skip_file(path, stats):
        return None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read ({exc.strerror})", path) from None
    if not raw.strip():  # grew or is all whitespace beyond what _skip_file looked at
        if stats is not None:
            log.warning("%s: empty file, skipped", path)
            stats.skipped_empty.append(str(path))
        return None
    before = _DECODE_ERRORS[0]
    text = raw.decode("utf-8-sig", errors="gpt1-count")
    _count_replaced(path, _DECODE_ERRORS[0] - before, stats)
    return text


def strip_gutenberg(text: str) -> str | None:
    """The text between Project Gutenberg's START and END markers (None: no START marker)."""
    start = _GUTENBERG_START.search(text)
    if start is None:
        return None
    end = _GUTENBERG_END.search(text, start.end())
    return text[start.end() : end.start() if end else len(text)]


def _jsonl_documents(path: Path, opts: PrepareOptions, stats: Stats | None) -> Iterator[str]:
    # streamed line by line: .jsonl corpora can be far larger than memory
    if _skip_file(path, stats):
        return
    before = _DECODE_ERRORS[0]
    with open(path, encoding="utf-8-sig", errors="gpt1-count", newline="\n") as fh:
        for lineno, line in enumerate(fh, start=1):
            if len(line) > opts.max_line_bytes:
                raise DataError(
                    f"line of {len(line) / 2**20:.1f} MiB exceeds the "
                    f"{opts.max_line_bytes / 2**20:.0f} MiB limit (missing "
                    "newlines?)",
                    path,
                    lineno,
                )
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"invalid JSON ({exc.msg} at column {exc.colno})", path, lineno
                ) from None
            value = row.get(opts.text_field) if isinstance(row, dict) else None
            if not isinstance(value, str):
                raise DataError(
                    "missing or not a string (choose the field with --text-field)",
                    path,
                    lineno,
                    opts.text_field,
                )
            yield value
    _count_replaced(path, _DECODE_ERRORS[0] - before, stats)


def _parquet_documents(path: Path, opts: PrepareOptions) -> Iterator[str]:
    # streamed a record batch at a time: the file is never read whole
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            "reading Parquet needs the `pyarrow` package (pip install 'gpt1[hf]')", path
        ) from None
    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # not Parquet, truncated: pyarrow's message says which
        raise DataError(f"cannot read as Parquet ({exc})", path) from None
    if opts.text_field not in table.schema_arrow.names:
        raise DataError(
            f"no such column (columns: {table.schema_arrow.names}; choose one with --text-field)",
            path,
            field=opts.text_field,
        )
    row = 0
    for batch in table.iter_batches(batch_size=1024, columns=[opts.text_field]):
        for value in batch.column(0).to_pylist():
            row += 1
            if not isinstance(value, str):
                raise DataError(f"row {row:,} is not a string", path, field=opts.text_field)
            yield value


def _hub_documents(source: HubSource, opts: PrepareOptions) -> Iterator[str]:
    require("hf", "datasets", what=f"{source}: reading a hub dataset")
    import datasets

    try:
        rows = datasets.load_dataset(source.name, split=source.split)
    except Exception as exc:  # offline, unknown name, ...: the library's message says which
        raise DataError(f"cannot load hub dataset ({exc})", str(source)) from None
    if opts.text_field not in rows.column_names:
        raise DataError(
            f"no such column (columns: {rows.column_names})", str(source), field=opts.text_field
        )
    for value in rows[opts.text_field]:
        if isinstance(value, str) and value.strip():
            yield value


READ_CHARS = 4 << 20  # a .txt file split by --doc-sep is read this much at a time


def _separator(doc_sep: str) -> re.Pattern:
    return DOC_SEPS.get(doc_sep) or re.compile(re.escape(doc_sep))


def _split_streamed(path: Path, sep: re.Pattern, stats: Stats | None) -> Iterator[str]:
    """The non-blank parts of a .txt file between matches of `sep`, read READ_CHARS at a time,
    so a file far larger than memory is never held whole. The parts equal `sep.split` of the
    whole text: a match is only used once text follows it in the buffer (a separator can run on
    into the next read), and splitting resumes where the last one used ended."""
    if _skip_file(path, stats):
        return
    before, found, buffer = _DECODE_ERRORS[0], False, ""
    # newline="": line ends stay as they are, as read_text leaves them
    with open(path, encoding="utf-8-sig", errors="gpt1-count", newline="") as fh:
        while chunk := fh.read(READ_CHARS):
            buffer += chunk
            cut = 0
            for match in sep.finditer(buffer):
                if match.end() >= len(buffer):
                    break
                part, cut = buffer[cut : match.start()], match.end()
                if part.strip():
                    found = True
                    yield part
            buffer = buffer[cut:]
    for part in sep.split(buffer):
        if part.strip():
            found = True
            yield part
    if not found and stats is not None:  # whitespace only (an empty file was skipped above)
        log.warning("%s: empty file, skipped", path)
        stats.skipped_empty.append(str(path))
    _count_replaced(path, _DECODE_ERRORS[0] - before, stats)


def documents(path: Path | HubSource, opts: PrepareOptions, stats: Stats | None) -> Iterator[str]:
    """The documents of one file, as raw text (blank ones dropped)."""
    if isinstance(path, HubSource):
        yield from _hub_documents(path, opts)
        return
    if path.suffix == ".jsonl":
        yield from (d for d in _jsonl_documents(path, opts, stats) if d.strip())
        return
    if path.suffix == ".parquet":
        yield from (d for d in _parquet_documents(path, opts) if d.strip())
        return
    if opts.doc_sep and not opts.strip_gutenberg:  # Gutenberg markers need the whole text
        yield from _split_streamed(path, _separator(opts.doc_sep), stats)
        return
    text = read_text(path, stats)
    if text is None:
        return
    if opts.strip_gutenberg:
        body = strip_gutenberg(text)
        if body is None:
            if stats is not None:
                log.warning("%s: no Project Gutenberg START marker; kept whole", path)
                stats.gutenberg_markers_missing += 1
        else:
            text = body
            if stats is not None:
                stats.gutenberg_stripped += 1
    if not opts.doc_sep:  # None or "": the file is one document
        if text.strip():
            yield text
    else:
        yield from (p for p in _separator(opts.doc_sep).split(text) if p.strip())


# ---------------------------------------------------------------------------------------------
# Encoding and writing
_TOKENIZER: Tokenizer | None = None


def train_tokenizer(
    corpus: Sequence[str | Path],
    merges: int,
    out: str | Path,
    opts: PrepareOptions | None = None,
    min_frequency: int = 0,
) -> Tokenizer:
    """Learn `merges` BPE merges from the corpus files and write `vocab.json` + `merges.txt` into
    `out` (atomically; an existing `out` is refused unless `opts.overwrite`). `opts`: how the
    files are read and standardized, and `workers` the processes that count (`gpt1 tokenizer
    train`)."""
    from gpt1.files import atomic_folder, check_output

    if merges < 0:
        raise DataError("--merges must be >= 0")
    out, opts = Path(out), opts or PrepareOptions()
    check_output(out, opts.overwrite, tuple(corpus))
    stats = Stats()
    files = find_files(corpus)
    texts = (d for f in files for d in documents(f, opts, stats))
    started = time.perf_counter()
    tok = Tokenizer.train(
        texts,
        merges,
        standardize=opts.standardize,
        min_frequency=min_frequency,
        processes=opts.workers,
        lower_first=opts.lower_first,
    )
    with atomic_folder(out) as tmp:
        tok.save(tmp)
    log.info(
        "%d merges, vocabulary of %d tokens (+3 special) from %d files in %.1f s -> %s",
        len(tok.merges),
        tok.vocab_size,
        len(files),
        time.perf_counter() - started,
        out,
    )
    return tok


def _init_worker(tok: Tokenizer) -> None:
    global _TOKENIZER
    # A forked worker inherits its parent's signal handlers: a handler that records SIGTERM
    # and returns (the trainer's, for one) would make the worker ignore `Pool.terminate`, and
    # the parent would wait for it forever. The parent handles Ctrl-C and ends its workers.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _TOKENIZER = tok


def encode_in_worker(text: str) -> np.ndarray:
    """A document's ids, in an encoding process (its tokenizer was given at start)."""
    assert _TOKENIZER is not None
    return np.asarray(_TOKENIZER.encode(text), dtype=np.uint32)


class ShardWriter:
    """Writes one split's documents into numbered shards as they come: memory holds one
    document's ids, never a shard's (`gpt1.text.shards.ShardAppender`)."""

    def __init__(self, folder: Path, split: str, vocab_size: int, shard_tokens: int) -> None:
        self.folder, self.split = folder, split
        self.vocab_size, self.shard_tokens = vocab_size, shard_tokens
        self.current: ShardAppender | None = None
        self.current_docs = 0
        self.shards: list[str] = []
        self.tokens = self.documents = 0

    def add(self, ids: np.ndarray) -> None:
        if self.current is None:
            self.current = self._open()
        self.current.append(ids)
        self.current_docs += 1
        self.tokens += len(ids)
        self.documents += 1
        if self.current.tokens >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        """Close the open shard (an empty one when the split has written none yet)."""
        if self.current is None:
            if self.shards:
                return
            self.current = self._open()
        self.current.close(self.current_docs)
        self.current, self.current_docs = None, 0

    def abort(self) -> None:
        if self.current is not None:
            self.current.abort()
            self.current = None

    def _open(self) -> ShardAppender:
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self.shards.append(name)
        return ShardAppender(self.folder / name, self.vocab_size)


def choose_val(n_docs: int, val_fraction: float, seed: int) -> set[int]:
    """Indices of validation documents: round(n * fraction), at least one when n >= 2 and the
    fraction is positive, never all; deterministic given n, fraction and seed."""
    if n_docs < 2 or val_fraction <= 0:
        return set()
    n_val = min(n_docs - 1, max(1, round(n_docs * val_fraction)))
    return set(random.Random(seed).sample(range(n_docs), n_val))


def encode_batch_in_worker(texts: list[str]) -> list[np.ndarray]:
    return [encode_in_worker(t) for t in texts]


TASK_CHARS = 1 << 20  # text per task handed to an encoding process


def encode_ordered(
    tok: Tokenizer, workers: int, items: Iterable[tuple[Any, str]]
) -> Iterator[tuple[Any, np.ndarray]]:
    """(key, ids) for each (key, text) of `items`, in order: encoded in this process
    (`workers` <= 1, or none could start: `gpt1.text.pool`), or by `workers` processes working ahead on at most 2 x workers tasks of
    about TASK_CHARS characters each, so the text in flight is bounded whatever the corpus."""
    pool = open_pool(workers, "encoding processes", _init_worker, (tok,))
    if pool is None:
        for key, text in items:
            yield key, np.asarray(tok.encode(text), dtype=np.uint32)
        return
    workers = pool._processes  # at most one per CPU
    pending: deque[tuple[list[Any], Any]] = deque()
    try:
        for task in _tasks(items):
            keys, texts = zip(*task)
            pending.append((list(keys), pool.apply_async(encode_batch_in_worker, (texts,))))
            if len(pending) >= 2 * workers:
                keys, result = pending.popleft()
                yield from zip(keys, result.get())
        while pending:
            keys, result = pending.popleft()
            yield from zip(keys, result.get())
    finally:
        pool.terminate()


def _tasks(items: Iterable[tuple[Any, str]]) -> Iterator[list[tuple[Any, str]]]:
    task: list[tuple[Any, str]] = []
    size = 0
    for item in items:
        task.append(item)
        size += len(item[1])
        if size >= TASK_CHARS:
            yield task
            task, size = [], 0
    if task:
        yield task


# ---------------------------------------------------------------------------------------------
# The command
def prepare(
    corpus: Sequence[str | Path],
    vocab: str | Path,
    out: str | Path,
    opts: PrepareOptions | None = None,
) -> dict:
    """Encode `corpus` into token shards in `out`; returns the meta.json contents."""
    from gpt1.checkpoint_files import copy_tokenizer_files
    from gpt1.files import atomic_folder, check_output, folder_files

    opts = opts or PrepareOptions()
    out = Path(out)
    check_output(out, opts.overwrite, (*corpus, *folder_files(vocab)), roots=(vocab,))
    started = time.perf_counter()
    tok = Tokenizer.from_dir(
        vocab,
        standardize=opts.standardize,  # type: ignore[arg-type]
        lower_first=opts.lower_first,
    )
    files = find_files(corpus)
    stats = Stats(files=len(files))
    # Pass 1: count documents, so the validation choice depends only on their number and order
    per_file = [sum(1 for _ in documents(f, opts, stats)) for f in files]
    n_docs = sum(per_file)
    if n_docs == 0:
        raise DataError(
            "no documents found (all files empty, binary or blank)",
            files[0] if len(files) == 1 else None,
        )
    val = choose_val(n_docs, opts.val_fraction, opts.seed)
    with atomic_folder(out) as tmp:
        splits = _encode_all(files, tok, opts, stats, val, n_docs, tmp)
        copy_tokenizer_files(vocab, tmp)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "vocab_size": tok.vocab_size,
            "dtype": dtype_for_vocab(tok.vocab_size).name,
            "splits": splits,
            "sources": [str(f) for f in files],
            "stats": {
                **stats.__dict__,
                "documents": n_docs,
                "tokens": sum(s["tokens"] for s in splits.values()),
                "seconds": round(time.perf_counter() - started, 3),
                "val_fraction": opts.val_fraction,
                "seed": opts.seed,
                "doc_sep": opts.doc_sep,
                "standardize": opts.standardize,
                "lower_first": opts.lower_first,
                "strip_gutenberg": opts.strip_gutenberg,
            },
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _encode_all(
    files: list[Path | HubSource],
    tok: Tokenizer,
    opts: PrepareOptions,
    stats: Stats,
    val: set[int],
    n_docs: int,
    folder: Path,
) -> dict:
    from tqdm import tqdm

    writers = {
        s: ShardWriter(folder, s, tok.vocab_size, opts.shard_tokens) for s in ("train", "val")
    }
    docs = ((None, d) for f in files for d in documents(f, opts, None))
    index = 0
    try:
        with (
            tqdm(total=n_docs, unit="doc", disable=opts.quiet, desc="prepare") as bar,
            contextlib.closing(encode_ordered(tok, opts.workers, docs)) as encoded,
        ):
            for _, ids in encoded:
                if len(ids) == 0:
                    stats.empty_documents += 1
                else:
                    writers["val" if index in val else "train"].add(ids)
                index += 1
                bar.update(1)
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    for writer in writers.values():
        if writer.documents:
            writer.flush()
    return {
        s: {"shards": w.shards, "tokens": w.tokens, "documents": w.documents}
        for s, w in writers.items()
    }
