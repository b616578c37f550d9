"""Line-numbered records from TSV, CSV and JSON Lines files.

Every record comes with the 1-based line number an editor shows for its first line, so that a
reader can name `file:line` and the field when a row is malformed. TSV is read without any quote
handling (GLUE's files contain unbalanced `"` characters; GLUE's own code reads them with
quoting off), so one physical line is one record. CSV follows RFC 4180 quoting (Story Cloze).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterator

from gpt1.errors import DataError
from gpt1.tasks.examples import BadRows, Example, UnknownLabelError

Record = dict[str, Any]
Builder = Callable[[int, Record], "Example | None"]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text without its line ending); undecodable bytes name their line."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot read file ({exc.strerror})", path) from None
    with fh:
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte-order mark is not part of the first field
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"not valid UTF-8 (byte {exc.start + 1} of the line)",
                                path, lineno) from None
            yield lineno, text.rstrip("\n").rstrip("\r")


def tsv_records(path: Path, bad: BadRows, names: list[str] | None = None,
                extra_last: str | None = None) -> Iterator[tuple[int, Record]]:
    """Records of a tab-separated file keyed by its header (or by `names` if it has none).

    A row with the wrong number of fields is malformed. `extra_last` names a column that is
    always the row's last field even when the row has more fields than the header (GLUE's
    SNLI/MNLI dev files list five annotator labels under a header that names one).
    """
    header = names
    for lineno, line in _lines(path):
        if header is None:
            header = line.split("\t")
            continue
        if line == "":
            continue  # blank line: nothing to read (trailing newlines are common)
        fields = line.split("\t")
        if len(fields) != len(header) and not (extra_last and len(fields) > len(header)):
            bad.report(DataError(f"expected {len(header)} tab-separated fields "
                                 f"({', '.join(header)}), got {len(fields)}", path, lineno))
            continue
        record = dict(zip(header, fields))
        if extra_last:
            record[extra_last] = fields[-1]
        yield lineno, record
    if header is None and names is None:
        raise DataError("empty file (expected a header line)", path)


def csv_records(path: Path, bad: BadRows) -> Iterator[tuple[int, Record]]:
    """Records of a comma-separated file with a header line; quoted fields may span lines."""
    lines = _lines(path)
    line_of = [0]

    def feed() -> Iterator[str]:
        for lineno, text in lines:
            line_of[0] = lineno
            yield text

    reader = csv.reader(feed())
    header: list[str] | None = None
    start = 1
    try:
        for fields in reader:
            first, start = start, line_of[0] + 1
            if header is None:
                header = fields
                continue
            if not fields:
                continue  # blank line
            if len(fields) != len(header):
                bad.report(DataError(f"expected {len(header)} comma-separated fields "
                                     f"({', '.join(header)}), got {len(fields)}", path, first))
                continue
            yield first, dict(zip(header, fields))
    except csv.Error as exc:
        raise DataError(f"malformed CSV ({exc})", path, line_of[0]) from None
    if header is None:
        raise DataError("empty file (expected a header line)", path)


def jsonl_records(path: Path, bad: BadRows) -> Iterator[tuple[int, Record]]:
    """One JSON object per line; blank lines are ignored."""
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.report(DataError(f"invalid JSON ({exc.msg} at column {exc.colno})", path, lineno))
            continue
        except RecursionError:  # hostile input: nesting deeper than Python's recursion limit
            bad.report(DataError("invalid JSON (nested too deeply)", path, lineno))
            continue
        if not isinstance(obj, dict):
            bad.report(DataError(f"expected a JSON object, got {type(obj).__name__}", path, lineno))
            continue
        yield lineno, obj


def records(path: Path, bad: BadRows, names: list[str] | None = None,
            extra_last: str | None = None) -> Iterator[tuple[int, Record]]:
    """Records of `path`, its format chosen by extension (.jsonl/.json, .csv, otherwise TSV)."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return jsonl_records(path, bad)
    if suffix == ".csv":
        return csv_records(path, bad)
    return tsv_records(path, bad, names=names, extra_last=extra_last)


def text_field(record: Record, name: str, path: Path, line: int, allow_empty: bool = False) -> str:
    """A required text column; missing, non-string or (unless allowed) empty is malformed."""
    if name not in record or record[name] is None:
        raise DataError(missing_column(name, record), path, line, name)
    value = record[name]
    if not isinstance(value, str):
        raise DataError(f"expected text, got {type(value).__name__}", path, line, name)
    if not allow_empty and not value.strip():
        raise DataError("empty text", path, line, name)
    return value


def missing_column(name: str, record: Record, what: str = "column") -> str:
    """"missing column 'x' (this row has: a, b)": the message names the columns that exist."""
    present = ", ".join(str(k) for k in record if record[k] is not None) or "no columns"
    return f"missing {what} {name!r} (this row has: {present})"


def optional_label(record: Record, name: str, path: Path, line: int, labels: list[str] | None,
                   aliases: dict[str, str] | None = None) -> int | float | None:
    """The label where it reads as one, else None: for prediction, which needs no labels (a gold
    label never seen in training, or a blank one, must not stop it)."""
    try:
        return label_field(record, name, path, line, labels, aliases)
    except DataError:
        return None


def label_field(record: Record, name: str, path: Path, line: int,
                labels: list[str] | None, aliases: dict[str, str] | None = None) -> int | float:
    """A class index (`labels` given) or a float score (`labels` None), from column `name`."""
    if name not in record or record[name] is None:
        raise DataError(missing_column(name, record, "label column"), path, line, name)
    raw = str(record[name]).strip()
    if labels is None:
        try:
            value = float(raw)
        except ValueError:
            raise DataError(f"expected a number, got {raw!r}", path, line, name) from None
        if not math.isfinite(value):  # NaN or inf would poison the loss silently
            raise DataError(f"score must be a finite number, got {raw!r}", path, line, name)
        return value
    key = (aliases or {}).get(raw, raw)
    if key not in labels:
        raise UnknownLabelError(f"unknown label {raw!r}; expected one of {', '.join(labels)}",
                        path, line, name)
    return labels.index(key)


def collect(recs: Iterator[tuple[int, Record]], bad: BadRows, build: Builder) -> tuple[list[Example], int]:
    """Examples built from records; malformed rows go to `bad`. Returns (examples, dropped):
    `build` returns None for rows that are deliberately left out (SNLI's "-" gold label)."""
    out: list[Example] = []
    dropped = 0
    for line, rec in recs:
        try:
            example = build(line, rec)
        except DataError as exc:
            bad.report(exc)
            continue
        if example is None:
            dropped += 1
        else:
            out.append(example)
    return out, dropped
