"""Token shard files: the on-disk format shared by `gpt1 prepare` (writer) and training (reader).

A shard is a 64-byte little-endian header followed by the token ids:

    offset  size  field
    0       8     magic b"GPT1TOK\\0"
    8       4     format version (uint32, currently 1)
    12      4     bytes per token (uint32: 2 = uint16, 4 = uint32)
    16      8     number of tokens (uint64)
    24      8     number of documents in the shard (uint64)
    32      32    reserved, zero

Documents are concatenated in order (GPT-1 trains on contiguous text); uint16 is used when the
vocabulary fits in it. Shards are read through a memory map, so corpora larger than RAM work.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from gpt1.errors import DataError

MAGIC = b"GPT1TOK\0"
VERSION = 1
HEADER_SIZE = 64
_HEADER = struct.Struct("<8sIIQQ32x")


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in it, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def write_shard(path: str | Path, tokens: np.ndarray, n_docs: int, vocab_size: int) -> None:
    """Write `tokens` (1-D ids) to `path` atomically (temporary name, then rename)."""
    shard = ShardAppender(path, vocab_size)
    try:
        shard.append(tokens)
    except BaseException:
        shard.abort()
        raise
    shard.close(n_docs)


class ShardAppender:
    """One shard written a document at a time, so a writer holds no more than one document's ids:
    the ids go to a temporary file as they come and the header (which counts them) is written
    last, before the file is renamed to `path`."""

    def __init__(self, path: str | Path, vocab_size: int) -> None:
        self.path = Path(path)
        self.vocab_size = vocab_size
        self.dtype = dtype_for_vocab(vocab_size)
        self.tokens = 0
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        self.fh = open(self.tmp, "wb")  # noqa: SIM115 (closed by close/abort)
        self.fh.write(bytes(HEADER_SIZE))  # placeholder until the count is known

    def append(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens)
        if tokens.size and (int(tokens.max()) >= self.vocab_size or int(tokens.min()) < 0):
            raise DataError(
                f"token id out of range for a vocabulary of {self.vocab_size}", self.path
            )
        self.fh.write(tokens.astype(self.dtype, copy=False).tobytes())
        self.tokens += int(tokens.size)

    def close(self, n_docs: int) -> None:
        header = _HEADER.pack(MAGIC, VERSION, self.dtype.itemsize, self.tokens, int(n_docs))
        self.fh.seek(0)
        self.fh.write(header)
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)


def read_header(path: str | Path) -> dict[str, int]:
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(HEADER_SIZE)
    except OSError as exc:
        raise DataError(f"cannot read token shard ({exc.strerror})", path) from None
    if len(raw) < HEADER_SIZE:
        raise DataError("truncated token shard header", path)
    magic, version, itemsize, n_tokens, n_docs = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise DataError(
            "not a gpt1 token shard (bad magic); create shards with `gpt1 prepare`", path
        )
    if version > VERSION:
        raise DataError(
            f"shard format version {version} is newer than this gpt1 reads ({VERSION})", path
        )
    if itemsize not in (2, 4):
        raise DataError(f"bad bytes-per-token {itemsize} in header", path)
    expected = HEADER_SIZE + n_tokens * itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise DataError(
            f"shard is {actual} bytes but its header promises {expected} "
            "(truncated or corrupt; re-run `gpt1 prepare`)",
            path,
        )
    return {"version": version, "itemsize": itemsize, "n_tokens": n_tokens, "n_docs": n_docs}


def read_shard(path: str | Path) -> np.ndarray:
    """Memory-map the token ids of a shard (read-only)."""
    header = read_header(path)
    dtype = np.uint16 if header["itemsize"] == 2 else np.uint32
    if header["n_tokens"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=HEADER_SIZE, shape=(header["n_tokens"],))
