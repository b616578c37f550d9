"""The project's own error types: every mistake a user can make surfaces as one of these.

The CLI prints a `Gpt1Error` as one line (no traceback unless `--debug`); anything else is a bug.
"""

from __future__ import annotations

from pathlib import Path


class Gpt1Error(Exception):
    """Base class for errors caused by input (files, flags, configs), not by a bug."""


class ConfigError(Gpt1Error):
    """An invalid configuration value or an unknown key."""


class CheckpointError(Gpt1Error):
    """A checkpoint or weight file that is missing, truncated, unsafe or the wrong shape."""


class DataError(Gpt1Error):
    """Bad input data. Names the file, the 1-based line and the field when they are known."""

    def __init__(
        self,
        message: str,
        path: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
    ):
        self.path, self.line, self.field, self.reason = path, line, field, message
        where = []
        if path is not None:
            where.append(str(path) + (f":{line}" if line is not None else ""))
        if field is not None:
            where.append(f"field {field!r}")
        # One line, always: a quoted field may hold line breaks (a CSV header run on by a
        # stray quote), which a message quoting it would otherwise carry onto new lines.
        text = (", ".join(where) + ": " if where else "") + message
        super().__init__(text.replace("\r", "\\r").replace("\n", "\\n"))
