"""Which file holds a split: candidates by name inside the task's data folder."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from gpt1.errors import DataError

SEPARATORS = {"\t": "tab", ",": "comma"}


def delimiter_of(path: Path, header: str) -> str:
    """The field separator of a table file: by its extension (.csv comma, .tsv tab), otherwise
    by its header line (a tab when it holds one, else a comma when it holds one, else a tab)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".tsv"):
        return "," if suffix == ".csv" else "\t"
    return "," if "\t" not in header and "," in header else "\t"


def find_split_file(data: Path, split: str, candidates: list[str]) -> Path:
    """The first of `candidates` (names or glob patterns) present in folder `data` as a regular
    file (a candidate that is there but is something else is named as such when no other is).

    `data` may also be a file: then it is used for whatever split is asked for, which lets a
    user evaluate on a single file in any of the task's formats.
    """
    data = Path(data)
    if data.is_file():
        return data
    if not data.is_dir():
        raise DataError(not_a_regular_file(data) or "no such data folder", data)
    odd: list[tuple[Path, str]] = []  # candidates that are there, but not regular files
    for name in candidates:
        found = sorted(data.glob(name)) if any(ch in name for ch in "*?[") else [data / name]
        for path in found:
            if path.is_file():
                return path
            what = not_a_regular_file(path)
            if what is not None:
                odd.append((path, what))
    if odd:
        path, what = odd[0]
        raise DataError(f"{what}, not a file that can hold the {split!r} split", path)
    raise DataError(f"no file for split {split!r} (looked for {', '.join(candidates)})", data)


def not_a_regular_file(path: Path) -> str | None:
    """What `path` is when something is there that cannot be read as a file ("is a directory",
    "is a symlink loop", ...); None when it is a regular file or nothing is there."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "is a symlink loop"
            return f"is a broken symlink (to {os.readlink(path)})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"is not a regular file ({kind})"
