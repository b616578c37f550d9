"""Which file holds a split: candidates by name inside the task's data folder."""

from __future__ import annotations

from pathlib import Path

from gpt1.errors import DataError


def find_split_file(data: Path, split: str, candidates: list[str]) -> Path:
    """The first of `candidates` (names or glob patterns) present in folder `data`.

    `data` may also be a file: then it is used for whatever split is asked for, which lets a
    user evaluate on a single file in any of the task's formats.
    """
    data = Path(data)
    if data.is_file():
        return data
    if not data.is_dir():
        raise DataError("no such data folder", data)
    for name in candidates:
        if any(ch in name for ch in "*?["):
            found = sorted(data.glob(name))
            if found:
                return found[0]
        elif (data / name).is_file():
            return data / name
    raise DataError(f"no file for split {split!r} (looked for {', '.join(candidates)})", data)
