"""Pretraining data: a `gpt1 prepare` folder read as contiguous windows, with exact-resume state.

The folder holds `meta.json` (format "gpt1-tokens", vocab_size, dtype, splits -> shards), the token
shards (`gpt1.text.shards`) and the tokenizer files. A training batch is `micro` windows of n_ctx + 1
contiguous tokens (inputs = the first n_ctx, targets = the last n_ctx), each starting at a uniformly
random offset within one shard (shards weighted by how many windows they hold).

All ranks draw the same window offsets from one seeded generator and each takes its own slice of
every global micro-step: rank r of W reads rows [r*micro, (r+1)*micro) of the micro*W windows drawn.
So 2 processes with micro-batch m see exactly the windows one process sees with 2 accumulation steps
of m, and the generator state (a JSON dict) is the whole cursor for exact resume.

`SequentialWindows` reads the same folder in order instead: consecutive windows of the token
stream, as `gpt1.text.stream` cuts them from text files read directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt1.config import file_inside, read_json_file
from gpt1.errors import ConfigError, DataError
from gpt1.text.shards import dtype_for_vocab, read_header, read_shard

META = "meta.json"


DIGEST_CHUNK = 1 << 24  # tokens hashed at a time (32-64 MB of the memory map)


@dataclass
class Split:
    """One split of a prepared folder: memory-mapped shards and their token counts (`folder`:
    where they were read from, named in errors)."""

    name: str
    shards: list[np.ndarray]
    tokens: int
    folder: Path | None = None
    _digest: str | None = dataclasses.field(default=None, repr=False, compare=False)

    def digest(self) -> str:
        """sha256 of the split's tokens, shard by shard, each shard's length and id width first:
        what a checkpoint records of the data its run trained on, so that a resume on other
        tokens (another corpus prepared into the same folder, a shard edited or replaced) is
        refused. Read once per process, at a resume or the first checkpoint (about a second a
        GB)."""
        if self._digest is None:
            h = hashlib.sha256()
            for shard in self.shards:
                flat = shard.reshape(-1)
                h.update(f"{flat.size}:{flat.dtype.str};".encode())
                for start in range(0, flat.size, DIGEST_CHUNK):
                    h.update(np.ascontiguousarray(flat[start : start + DIGEST_CHUNK]))
            self._digest = h.hexdigest()
        return self._digest

    def check_digest(self, state: dict) -> None:
        """Refuse a source state (`WindowSource.state_dict`) made on other tokens than these. A
        state without a digest (a checkpoint from before gpt1 recorded one) passes."""
        recorded = state.get("data")
        if recorded is not None and recorded != self.digest():
            where = f" of {self.folder}" if self.folder is not None else ""
            raise DataError(
                f"the {self.name} split{where} holds other tokens than the run being resumed "
                "was trained on (their digests differ: another corpus prepared into this folder, "
                "or a shard changed); resume with the data the run was trained on, or start a "
                "new run in another --out"
            )


@dataclass
class PreparedData:
    folder: Path
    meta: dict[str, Any]
    vocab_size: int
    splits: dict[str, Split]


def open_prepared(folder: str | Path) -> PreparedData:
    """Read and check `meta.json` and memory-map every shard it lists."""
    folder = Path(folder)
    meta_file = folder / META
    if not meta_file.is_file():
        raise DataError(
            f"no {META} here; create the folder with `gpt1 prepare --out {folder}`", folder
        )
    meta = read_json_file(meta_file, DataError)
    if not isinstance(meta, dict) or meta.get("format") != "gpt1-tokens":
        raise DataError('expected "format": "gpt1-tokens"', meta_file, field="format")
    version = meta.get("version", 0)
    if type(version) is not int:
        raise DataError("version must be an integer", meta_file, field="version")
    if version > 1:
        raise DataError(
            f"version {version} is newer than this gpt1 reads (1)", meta_file, field="version"
        )
    vocab = meta.get("vocab_size")
    if type(vocab) is not int or not 0 < vocab <= 2**32:  # type(): JSON true is not a size
        raise DataError(
            "vocab_size must be an integer in 1..2**32 (ids are stored as uint32 at most)",
            meta_file,
            field="vocab_size",
        )
    dtype = meta.get("dtype")
    if dtype is not None and dtype not in ("uint16", "uint32"):
        raise DataError(f"dtype must be uint16 or uint32, got {dtype!r}", meta_file, field="dtype")
    splits_meta = meta.get("splits")
    if not isinstance(splits_meta, dict) or "train" not in splits_meta:
        raise DataError('expected "splits" with at least "train"', meta_file, field="splits")
    splits = {}
    for name, info in splits_meta.items():
        if not isinstance(info, dict) or not isinstance(info.get("shards"), list):
            raise DataError(
                f'split {name!r} needs a "shards" list', meta_file, field=f"splits.{name}.shards"
            )
        arrays, documents = [], 0
        for i, shard in enumerate(info["shards"]):
            path = shard_path(folder, shard, meta_file, f"splits.{name}.shards[{i}]")
            if not path.is_file():
                raise DataError("shard listed in meta.json is missing", path)
            tokens = read_shard(path)
            if dtype is not None and tokens.dtype != np.dtype(dtype):
                raise DataError(f"shard stores {tokens.dtype} ids but meta.json says {dtype}", path)
            check_vocab_size(tokens, vocab, path, meta_file)
            check_token_ids(tokens, vocab, path)
            arrays.append(tokens)
            documents += read_header(path)["n_docs"]
        splits[name] = Split(name, arrays, int(sum(a.size for a in arrays)), folder)
        check_counts(info, splits[name], documents, meta_file)
    return PreparedData(folder, meta, vocab, splits)


def check_vocab_size(tokens: np.ndarray, vocab_size: int, path: Path, meta_file: Path) -> None:
    """A shard's id width is the one `gpt1 prepare` picks for meta.json's `vocab_size` (uint16 up
    to 65,536 tokens, else uint32): another width means the size was edited or belongs to
    other shards."""
    if tokens.dtype != dtype_for_vocab(vocab_size):
        raise DataError(
            f"says {vocab_size:,} but shard {path.name} stores {tokens.dtype} ids, which "
            f"belong to a vocabulary of {'at most 65,536' if tokens.dtype == np.uint16 else 'over 65,536'}"
            " tokens; re-run `gpt1 prepare`",
            meta_file,
            field="vocab_size",
        )


def check_counts(info: dict[str, Any], split: Split, documents: int, meta_file: Path) -> None:
    """meta.json's `tokens` and `documents` of a split (when given) are what its shards hold:
    a count that disagrees means the folder was edited or mixed from two `gpt1 prepare` runs."""
    for field, held in (("tokens", split.tokens), ("documents", documents)):
        if field not in info:
            continue
        said = info[field]
        if type(said) is not int or said != held:
            raise DataError(
                f"says {said!r} but the split's shards ({', '.join(map(str, info['shards']))}) "
                f"hold {held:,}; re-run `gpt1 prepare`",
                meta_file,
                field=f"splits.{split.name}.{field}",
            )


def shard_path(folder: Path, name: Any, meta_file: Path, field: str) -> Path:
    """A shard file named in meta.json: a plain relative name that stays inside `folder`."""
    try:
        return file_inside(folder, name)
    except ConfigError as exc:
        raise DataError(f"shard {exc}", meta_file, field=field) from None


ID_CHECK_CHUNK = 1 << 24  # tokens per pass of the id check (32-64 MB of the memory map)


def check_token_ids(tokens: np.ndarray, vocab_size: int, path: Path) -> None:
    """Every id of a shard is below `vocab_size`, checked once at open in bounded chunks, so a
    bad id is an error naming the file instead of an IndexError deep inside a training run."""
    for start in range(0, tokens.size, ID_CHECK_CHUNK):
        chunk = tokens[start : start + ID_CHECK_CHUNK]
        top = int(chunk.max())
        if top >= vocab_size:
            at = start + int(np.argmax(chunk >= vocab_size))
            raise DataError(
                f"token id {int(tokens[at])} at position {at:,} is out of range for "
                f"the vocabulary of {vocab_size:,} in meta.json (the shard belongs to "
                "another vocabulary or is damaged; re-run `gpt1 prepare`)",
                path,
            )


class WindowSource:
    """Random contiguous windows for one rank (the trainer's `BatchSource`)."""

    def __init__(self, split: Split, n_ctx: int, seed: int, rank: int = 0, world_size: int = 1):
        self.n_ctx, self.rank, self.world = int(n_ctx), int(rank), int(world_size)
        self.split = split
        self.shards = [s for s in split.shards if s.size >= self.n_ctx + 1]
        if not self.shards:
            raise DataError(
                f"the {split.name} split has no shard with at least {n_ctx + 1} tokens; "
                "lower data.n_ctx or prepare more text"
            )
        starts = np.array([s.size - self.n_ctx for s in self.shards], dtype=np.int64)
        self._cum = np.cumsum(starts) / starts.sum()  # shard chosen in proportion to its windows
        self._starts = starts
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def next_batch(self, micro_batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets `[micro, n_ctx]` (int64) for this rank."""
        n = micro_batch_size * self.world
        # One (shard, offset) pair of uniforms per window, drawn row by row: the windows depend only
        # on how many were drawn before, not on how they are split into micro-batches or ranks.
        u = self.rng.random((n, 2))  # [n, 2]
        which = np.minimum(np.searchsorted(self._cum, u[:, 0], side="right"), len(self.shards) - 1)
        offsets = (u[:, 1] * self._starts[which]).astype(np.int64)
        mine = slice(self.rank * micro_batch_size, (self.rank + 1) * micro_batch_size)
        rows = [self.shards[s][o : o + self.n_ctx + 1] for s, o in zip(which[mine], offsets[mine])]
        window = torch.from_numpy(np.stack(rows).astype(np.int64))  # [micro, n_ctx + 1]
        return window[:, :-1], window[:, 1:]

    def state_dict(self) -> dict:
        """The cursor (the generator's state) and the digest of the tokens it draws from."""
        return {"rng": self.rng.bit_generator.state, "data": self.split.digest()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict`, refused where the tokens differ (`Split.check_digest`)."""
        self.split.check_digest(state)
        self.rng.bit_generator.state = state["rng"]


class SequentialWindows:
    """Consecutive windows of a split's token stream (its shards in order, documents in the order
    `gpt1 prepare` read them), a `BatchSource` for `data.order = "sequential"`.

    Window g holds tokens [g * n_ctx, g * n_ctx + n_ctx + 1) of the stream repeated end to end
    (the last window of a pass runs on into the next). Ranks slice every global micro-step as
    `WindowSource` does; the cursor is the number of windows taken.
    """

    def __init__(self, split: Split, n_ctx: int, rank: int = 0, world_size: int = 1):
        self.n_ctx, self.rank, self.world = int(n_ctx), int(rank), int(world_size)
        self.split = split
        self.shards = [s for s in split.shards if s.size]
        self.total = int(sum(s.size for s in self.shards))
        if self.total < self.n_ctx + 1:
            raise DataError(
                f"the {split.name} split holds {self.total} tokens, fewer than one window of "
                f"{n_ctx + 1}; lower data.n_ctx or prepare more text"
            )
        self._ends = np.cumsum([s.size for s in self.shards])  # [n_shards]
        self.window = 0

    def next_batch(self, micro_batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.window + self.rank * micro_batch_size
        rows = [self._tokens((first + i) * self.n_ctx) for i in range(micro_batch_size)]
        self.window += micro_batch_size * self.world
        window = torch.from_numpy(np.stack(rows).astype(np.int64))  # [micro, n_ctx + 1]
        return window[:, :-1], window[:, 1:]

    def _tokens(self, start: int) -> np.ndarray:
        """n_ctx + 1 tokens from stream position `start`, wrapping past the end."""
        out, pos, need = [], start % self.total, self.n_ctx + 1
        while need:
            shard = int(np.searchsorted(self._ends, pos, side="right"))
            begin = pos - (int(self._ends[shard - 1]) if shard else 0)
            piece = self.shards[shard][begin : begin + need]
            out.append(piece)
            need -= piece.size
            pos = (pos + piece.size) % self.total
        return np.concatenate(out)

    def state_dict(self) -> dict:
        """The cursor (windows taken) and the digest of the tokens it reads."""
        return {"window": self.window, "data": self.split.digest()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict`, refused where the tokens differ (`Split.check_digest`)."""
        self.split.check_digest(state)
        self.window = int(state["window"])


def validation_windows(split: Split, n_ctx: int, limit: int) -> torch.Tensor:
    """A fixed validation set `[N, n_ctx + 1]`: non-overlapping windows, `limit` evenly spaced (0 = all)."""
    windows = []
    for shard in split.shards:
        count = (shard.size - 1) // n_ctx
        for i in range(count):
            windows.append((shard, i * n_ctx))
    if not windows:
        raise DataError(
            f"the {split.name} split has fewer than {n_ctx + 1} tokens in every shard; "
            "lower data.n_ctx or prepare a larger validation split"
        )
    if limit and len(windows) > limit:
        picks = np.linspace(0, len(windows) - 1, limit).round().astype(int)
        windows = [windows[i] for i in picks]
    rows = [s[o : o + n_ctx + 1] for s, o in windows]
    return torch.from_numpy(np.stack(rows).astype(np.int64))
