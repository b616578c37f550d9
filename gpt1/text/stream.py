"""Pretraining straight from text files: documents read and tokenized while training, cut into
the paper's contiguous windows, with the stream position as the exact-resume cursor.

`data.path` names .txt, .jsonl or .parquet files (a file, a folder walked recursively, or a glob).
They are read exactly as `gpt1 prepare` reads them (`gpt1.text.prepare.documents`: the same file
order, document splitting and cleaning, the same tokenizer settings) and the documents' ids are
concatenated with no separator. Window g is tokens [g * n_ctx, g * n_ctx + n_ctx + 1) of that
stream, the stream repeating end to end (one pass = one epoch). So one process reading text
files sees exactly the windows `gpt1.text.windows.SequentialWindows` cuts from the shards that
`gpt1 prepare --val-fraction 0` writes from the same text.

Several processes: rank r of W reads every file but tokenizes only the documents numbered
r, r + W, r + 2W, ... in each pass, and cuts its windows from its own share. Memory holds the
ids of the documents the next window spans and the text of the file being read (a .txt file is
read whole, as `gpt1 prepare` reads it; .jsonl and .parquet files a row at a time). The cursor
(pass, file, document, token offset) is a small JSON dict: all that an exact resume needs.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

import numpy as np
import torch

from gpt1.config import DataConfig
from gpt1.errors import ConfigError, DataError
from gpt1.files import not_a_data_path
from gpt1.text.prepare import (
    EXTENSIONS,
    PrepareOptions,
    Stats,
    documents,
    encode_ordered,
    find_files,
)
from gpt1.text.tokenizer import Tokenizer
from gpt1.text.windows import META, PreparedData, SequentialWindows, WindowSource, open_prepared

KIND = "text-stream"
log = logging.getLogger("gpt1.text.stream")


@dataclass
class TextData:
    """Text files to pretrain on directly, and how to read and tokenize them."""

    spec: str
    files: list[Path]
    tokenizer: Tokenizer
    tokenizer_dir: Path
    opts: PrepareOptions

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def open_data(cfg: DataConfig) -> PreparedData | TextData:
    """`cfg.path` opened: a `gpt1 prepare` folder (memory-mapped shards) or text files."""
    path = Path(cfg.path)
    if path.is_dir() and (path / META).is_file():
        if cfg.tokenizer:
            raise ConfigError(
                f"data.tokenizer is for text files; {path} is a `gpt1 prepare` folder, which "
                "carries its own tokenizer"
            )
        return open_prepared(path)
    if cfg.path.startswith("hub:"):
        raise ConfigError("pretrain reads local files; `gpt1 prepare` reads hub datasets")
    if path.is_dir() and not cfg.tokenizer:
        raise DataError(
            f"no {META} here; create the folder with `gpt1 prepare --out {path}`, or read its "
            "text files directly with --tokenizer DIR",
            path,
        )
    files = find_text_files(cfg.path)
    if not cfg.tokenizer:
        raise ConfigError(
            f"reading text files ({cfg.path}) needs their tokenizer: pass --tokenizer DIR, or "
            "encode them first with `gpt1 prepare`"
        )
    opts = PrepareOptions(
        doc_sep=cfg.doc_sep or None,
        text_field=cfg.text_field,
        strip_gutenberg=cfg.strip_gutenberg,
    )  # the tokenizer settings are prepare's defaults, so both paths give the same ids
    tokenizer = Tokenizer.from_dir(cfg.tokenizer, opts.standardize, opts.lower_first)  # type: ignore[arg-type]
    return TextData(cfg.path, files, tokenizer, Path(cfg.tokenizer), opts)


def find_text_files(spec: str) -> list[Path]:
    """A file, a folder (its .txt/.jsonl/.parquet files, recursively, sorted) or a glob pattern
    (the matching files with those suffixes, sorted)."""
    if not any(c in spec for c in "*?["):
        if not (Path(spec).is_file() or Path(spec).is_dir()):
            raise DataError(not_a_data_path(spec), spec)
        return [Path(f) for f in find_files([spec])]
    found = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).suffix in EXTENSIONS)
    found = [p for p in found if p.is_file()]
    if not found:
        raise DataError("the pattern matches no .txt, .jsonl or .parquet file", spec)
    return found


def batch_source(
    data: PreparedData | TextData, cfg: DataConfig, n_ctx: int, seed: int, rank: int, world: int
) -> WindowSource | SequentialWindows | TextWindows:
    """The trainer's `BatchSource` for `data` in the order `cfg.order` asks for."""
    if isinstance(data, TextData):
        if cfg.order == "random":
            raise ConfigError(
                "data.order=random needs a `gpt1 prepare` folder; text files are read in order "
                "(data.order=sequential)"
            )
        return TextWindows(data, n_ctx, rank, world, cfg.workers)
    if cfg.order == "sequential":
        return SequentialWindows(data.splits["train"], n_ctx, rank, world)
    return WindowSource(data.splits["train"], n_ctx, seed, rank, world)


class Cursor(NamedTuple):
    """Where a document sits in the stream: pass, file, its number in the file and in the
    pass; and the digest of its file's documents up to and including it (`chain`)."""

    epoch: int
    file: int
    doc: int
    index: int
    digest: str = ""


def chain(digest: str, text: str) -> str:
    """The digest of a file's documents read so far (`digest`, "" before the first) extended by
    the next document `text`: a resume compares it with the checkpoint's, so text inserted,
    removed or edited anywhere before the stream position is refused (a count of documents
    or tokens cannot see a document inserted in front of others of the same length)."""
    inner = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return hashlib.sha256(digest.encode() + inner).hexdigest()[:32]


class TextWindows:
    """Consecutive windows of text files' token stream for one rank (the trainer's `BatchSource`)."""

    def __init__(
        self, data: TextData, n_ctx: int, rank: int = 0, world_size: int = 1, workers: int = 1
    ):
        self.data, self.n_ctx, self.workers = data, int(n_ctx), int(workers)
        self.rank, self.world = int(rank), int(world_size)
        self._start = Cursor(0, 0, 0, 0)  # the first document to read
        self._held: deque[tuple[Cursor, np.ndarray]] = deque()  # ids the next window may span
        self._held_tokens = 0
        self._offset = 0  # ids of the first held document already behind the cursor
        self._reader: Iterator[tuple[Cursor, np.ndarray]] | None = None
        self._file_digests: dict[int, str] = {}  # `chain` of each file read whole (every pass)
        self._resume_digest = ""  # `chain` of the start file's documents before the start one
        self._loaded: dict | None = None  # the state loaded, while nothing was read since

    def next_batch(self, micro_batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets `[micro, n_ctx]` (int64): this rank's next windows."""
        rows = [self._window() for _ in range(micro_batch_size)]
        window = torch.from_numpy(np.stack(rows))  # [micro, n_ctx + 1]
        return window[:, :-1], window[:, 1:]

    def _window(self) -> np.ndarray:
        need = self.n_ctx + 1
        while self._held_tokens - self._offset < need:
            self._hold(*next(self._documents()))
        out, skip = [], self._offset  # the cursor is inside the first held document
        for _, ids in self._held:
            piece = ids[skip : skip + need]
            out.append(piece)
            need, skip = need - piece.size, 0
            if not need:
                break
        self._offset += self.n_ctx
        while self._offset >= self._held[0][1].size:  # documents now wholly behind the cursor
            self._offset -= self._held[0][1].size
            self._held_tokens -= self._held.popleft()[1].size
        return np.concatenate(out)

    def _hold(self, cursor: Cursor, ids: np.ndarray) -> None:
        self._loaded = None
        self._held.append((cursor, ids))
        self._held_tokens += ids.size

    def _documents(self) -> Iterator[tuple[Cursor, np.ndarray]]:
        if self._reader is None:
            self._reader = self._read(self._start)
        return self._reader

    def _read(self, start: Cursor) -> Iterator[tuple[Cursor, np.ndarray]]:
        """This rank's documents as ids, from `start` on, pass after pass."""
        epoch, tokens, whole_pass = start.epoch, 0, (start.file, start.doc) == (0, 0)
        encoded = encode_ordered(self.data.tokenizer, self.workers, self._texts(start))
        with contextlib.closing(encoded):  # closing this reader stops the encoding processes
            for cursor, ids in encoded:
                if cursor.epoch != epoch:
                    self._check_pass(tokens, whole_pass)
                    epoch, tokens, whole_pass = cursor.epoch, 0, True
                tokens += ids.size
                if ids.size:
                    yield cursor, ids.astype(np.int64)

    def _texts(self, start: Cursor) -> Iterator[tuple[Cursor, str]]:
        """This rank's documents as text (documents r, r + W, ... of each pass)."""
        epoch, first_file, first_doc, index = start[:4]
        files, digest = self.data.files, self._resume_digest
        while True:
            mine = 0
            for f in range(first_file, len(files)):
                warn = Stats() if epoch == 0 and self.rank == 0 else None  # warned once
                for d, text in enumerate(documents(files[f], self.data.opts, warn)):
                    if f == first_file and d < first_doc:
                        continue  # read before the checkpoint: `digest` holds them
                    digest = chain(digest, text)  # every rank's documents: the same digests
                    if index % self.world == self.rank:
                        mine += 1
                        yield Cursor(epoch, f, d, index, digest), text
                    index += 1
                self._file_digests[f], digest = digest, ""
            if not mine and (first_file, first_doc) == (0, 0):
                self._check_pass(0, True)
            epoch, first_file, first_doc, index = epoch + 1, 0, 0, 0

    def _check_pass(self, tokens: int, whole_pass: bool) -> None:
        if whole_pass and tokens < self.n_ctx + 1:
            raise DataError(
                f"one pass over {self.data.spec} gives "
                + (f"rank {self.rank} of {self.world} " if self.world > 1 else "")
                + f"{tokens} tokens, fewer than one window of {self.n_ctx + 1}; add text or "
                "lower data.n_ctx"
            )

    def state_dict(self) -> dict:
        """The cursor: the document the next window starts in and the offset into it, its
        token count, and the digests of the text read up to it (`files`: each file read whole
        in this pass, or in every pass after the first; `digest`: the cursor's file up to and
        including the cursor's document)."""
        if not self._held:  # nothing read yet: where the stream starts
            return dict(self._loaded) if self._loaded else self._state(self._start, 0, None)
        cursor, ids = self._held[0]
        return self._state(cursor, self._offset, int(ids.size))

    def _state(self, cursor: Cursor, offset: int, doc_tokens: int | None) -> dict:
        whole = len(self.data.files) if cursor.epoch else cursor.file
        return {
            "kind": KIND,
            "rank": self.rank,
            "world": self.world,
            "epoch": cursor.epoch,
            "file": cursor.file,
            "path": str(self.data.files[cursor.file]),
            "doc": cursor.doc,
            "index": cursor.index,
            "offset": offset,
            "doc_tokens": doc_tokens,
            "files": [[str(self.data.files[f]), self._file_digests[f]] for f in range(whole)],
            "digest": cursor.digest,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict`, after checking that the text read up to it is the text
        the checkpoint's run read (refused otherwise, naming the file that differs)."""
        if state.get("kind") != KIND:
            raise DataError(
                "the checkpoint was trained on a prepared folder, not on text files; resume "
                "with the same --data"
            )
        if (state["world"], state["rank"]) != (self.world, self.rank):
            raise DataError(
                f"the checkpoint's text stream was split over {state['world']} processes; "
                f"resume with {state['world']} (this run has {self.world})"
            )
        f = int(state["file"])
        if f >= len(self.data.files) or str(self.data.files[f]) != state["path"]:
            raise DataError(
                f"the checkpoint's stream position is in {state['path']}, which is not file "
                f"{f + 1} of {self.data.spec} any more; resume with the same files"
            )
        start = Cursor(int(state["epoch"]), f, int(state["doc"]), int(state["index"]))
        if self._reader is not None:
            self._reader.close()  # stops its tokenizing processes
        self._held, self._held_tokens, self._reader = deque(), 0, None
        self._file_digests, self._resume_digest = read_before(self.data, start, state)
        self._start = start._replace(digest=self._resume_digest)
        self._offset = int(state["offset"])
        self._loaded = dict(state)


def read_before(data: TextData, start: Cursor, state: dict) -> tuple[dict[int, str], str]:
    """Read the text a checkpoint's run read before its stream position `start` (the files
    before the position's, or every file after the first pass, and the position's file up to
    and including its document) and refuse any difference from the checkpoint's digests
    (`state`), naming the file. Returns the files' digests and the position file's digest
    before the position's document. A checkpoint written before gpt1 recorded digests has
    only the position document's token count checked (warned)."""
    recorded, digest = state.get("files"), state.get("digest")
    whole = len(data.files) if start.epoch else start.file
    if recorded is not None:
        _check_file_list(data, recorded, whole)
    else:
        log.warning(
            "the checkpoint records no digest of the text read before its stream position "
            "(written by an older gpt1): only the token count of document %d of %s is "
            "checked, so resume with exactly the files it was trained on",
            start.doc,
            data.files[start.file],
        )
    digests: dict[int, str] = {}
    for f in range(whole):
        digests[f] = _file_digest(data, f)[0]
        if recorded is not None and digests[f] != recorded[f][1]:
            _changed(data.files[f], "its documents are not those the run read")
    if digest == "":  # the state of a stream that had read nothing yet: no text to compare
        return digests, ""
    through, before, text = _file_digest(data, start.file, start.doc)
    if text is None:
        _changed(data.files[start.file], f"it has no document {start.doc + 1} any more")
    if digest is not None and through != digest:
        _changed(
            data.files[start.file],
            f"its documents up to number {start.doc + 1} are not those the run read",
        )
    _check_tokens(data, text, state.get("doc_tokens"), start)
    return digests, before


def _file_digest(data: TextData, f: int, stop: int | None = None) -> tuple[str, str, str | None]:
    """(`chain` of file `f`'s documents up to and including number `stop`, or all of them;
    the `chain` before document `stop`; its text, None when the file has fewer documents)."""
    running, before, text = "", "", None
    for d, doc in enumerate(documents(data.files[f], data.opts, None)):
        if d == stop:
            before, text = running, doc
        running = chain(running, doc)
        if d == stop:
            break
    return running, before, text


def _check_file_list(data: TextData, recorded: list, whole: int) -> None:
    """The files the checkpoint's run read whole are the first files of `data`, in order."""
    if len(recorded) != whole:
        raise DataError(
            f"the checkpoint's run read {len(recorded)} files before its stream position, "
            f"{data.spec} now puts {whole} there; resume with the same files, or start a new "
            "--out"
        )
    for f, (path, _) in enumerate(recorded):
        if str(data.files[f]) != path:
            _changed(data.files[f], f"file {f + 1} of the run was {path}")


def _check_tokens(data: TextData, text: str | None, tokens: Any, start: Cursor) -> None:
    """The document at the stream position has the token count the checkpoint records (the
    same text under another tokenizer would not)."""
    if tokens is None or text is None:
        return
    have = len(data.tokenizer.encode(text))
    if have != int(tokens):
        _changed(
            data.files[start.file],
            f"document {start.doc + 1}, where the stream position is, has {have} tokens, not "
            f"the {tokens} the run read",
        )


def _changed(path: Path, why: str) -> NoReturn:
    raise DataError(
        f"the text changed since the checkpoint was written ({why}); resume with the same "
        "files, or start a new --out",
        path,
    )
