"""Line-numbered records from TSV, CSV and JSON Lines files.

Every record comes with the 1-based line number an editor shows for its first line, so that a
reader can name `file:line` and the field when a row is malformed. TSV is read without any quote
handling (GLUE's files contain unbalanced `"` characters; GLUE's own code reads them with
quoting off), so one physical line is one record. CSV follows RFC 4180 quoting (Story Cloze).

The same rules hold in every format (each breach is a `DataError` naming file, line and field):
- Files are UTF-8; a UTF-8 byte-order mark before the first line is ignored, a UTF-16 one is
  named as such.
- Lines end in LF or CRLF, or in a lone CR in a file with no LF at all (a spreadsheet's
  "CSV (Macintosh)"); any other CR is a stray one, and a row with one outside CSV quotes is
  malformed.
- A header (TSV, CSV) names each column once; a JSON object names each key once.
- No field holds more than `MAX_FIELD_CHARS` characters (`check_field_sizes`, the one check).
- JSON Lines: standard JSON only (NaN and Infinity are not JSON); text fields are strings;
  a class label is a string or an integer (1 and "1" are the same class), never a list,
  object, boolean or fraction; a regression score is a finite number or a string holding one.
- Empty text is an error unless a reader allows it (RACE questions); an empty label is an error.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from gpt1.errors import DataError
from gpt1.tasks.examples import BadRows, Example, UnknownLabelError

Record = dict[str, Any]
Builder = Callable[[int, Record], "Example | None"]

# The longest field any reader accepts, in characters: far beyond any text the model can read
# (512 tokens are a few thousand characters), small enough that a damaged or hostile file is
# refused before its rows are tokenized.
MAX_FIELD_CHARS = 1 << 20
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def check_field_sizes(
    record: Record | list, path: Path, line: int | None, where: str | None = None
) -> None:
    """Every string in `record` (nested lists and objects included) is at most
    MAX_FIELD_CHARS long; the first that is not names its field."""
    items = record.items() if isinstance(record, dict) else enumerate(record)
    for key, value in items:
        name = (
            str(key)
            if where is None
            else f"{where}[{key!r}]"
            if isinstance(key, str)
            else f"{where}[{key}]"
        )
        if isinstance(value, str):
            if len(value) > MAX_FIELD_CHARS:
                raise DataError(
                    f"field of {len(value):,} characters; the limit is {MAX_FIELD_CHARS:,}",
                    path,
                    line,
                    name,
                )
        elif isinstance(value, (dict, list)):
            check_field_sizes(value, path, line, name)


def check_header(names: list[str], path: Path, line: int) -> None:
    """A header names each column once (a repeated name would hide one of the columns)."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DataError(f"column {name!r} appears twice in the header", path, line, name)
        seen.add(name)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_json(text: str, path: Path, line: int | None) -> Any:
    """Strict JSON: duplicate keys (at any depth), NaN and Infinity are errors."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except _DuplicateKey as exc:
        raise DataError(
            f"key {exc.args[0]!r} appears twice in one JSON object", path, line, exc.args[0]
        ) from None
    except json.JSONDecodeError as exc:
        raise DataError(
            f"invalid JSON ({exc.msg} at column {exc.colno})",
            path,
            line if line is not None else exc.lineno,
        ) from None
    except ValueError as exc:  # NaN / Infinity
        raise DataError(f"invalid JSON ({exc})", path, line) from None
    except RecursionError:  # hostile input: nesting deeper than Python's recursion limit
        raise DataError("invalid JSON (nested too deeply)", path, line) from None


def numbered_lines(path: Path, keep_endings: bool = False) -> Iterator[tuple[int, str]]:
    """(line number, text without its line ending, or with it where `keep_endings`: a CSV
    field in quotes keeps the line breaks inside it); undecodable bytes name their line."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot read file ({exc.strerror})", path) from None
    with fh:
        for lineno, raw in enumerate(_cr_lines(fh) if _ends_lines_with_cr(fh) else fh, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte-order mark is not part of the first field
            elif lineno == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
                raise DataError(
                    "UTF-16 text (byte-order mark); save the file as UTF-8", path, lineno
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"not valid UTF-8 (byte {exc.start + 1} of the line)", path, lineno
                ) from None
            yield lineno, text if keep_endings else text.rstrip("\n").rstrip("\r")


def _ends_lines_with_cr(fh: BinaryIO) -> bool:
    """Whether an open file ends its lines in a lone CR: its first 64 KiB hold a CR and no LF."""
    head = fh.read(1 << 16)
    fh.seek(0)
    return b"\r" in head and b"\n" not in head


def _cr_lines(fh: BinaryIO) -> Iterator[bytes]:
    """The lines of a file whose lines end in a lone CR, each with its CR (as `fh`'s own
    iteration keeps the LF)."""
    rest = b""
    for chunk in iter(lambda: fh.read(1 << 20), b""):
        *lines, rest = (rest + chunk).split(b"\r")
        yield from (line + b"\r" for line in lines)
    if rest:
        yield rest


def tsv_records(
    path: Path, bad: BadRows, names: list[str] | None = None, extra_last: str | None = None
) -> Iterator[tuple[int, Record]]:
    """Records of a tab-separated file keyed by its header (or by `names` if it has none).

    A row with the wrong number of fields is malformed. `extra_last` names a column that is
    always the row's last field even when the row has more fields than the header (GLUE's
    SNLI/MNLI dev files list five annotator labels under a header that names one).
    """
    header = names
    for lineno, line in numbered_lines(path):
        if header is None:
            header = line.split("\t")
            check_header(header, path, lineno)
            continue
        if line == "":
            continue  # blank line: nothing to read (trailing newlines are common)
        if "\r" in line:
            bad.report(DataError(STRAY_CR, path, lineno))
            continue
        record = _record(line.split("\t"), header, "tab", path, lineno, bad, extra_last)
        if record is not None:
            yield lineno, record
    if header is None and names is None:
        raise DataError("empty file (expected a header line)", path)


def _record(
    fields: list[str],
    header: list[str],
    separator: str,
    path: Path,
    lineno: int,
    bad: BadRows,
    extra_last: str | None = None,
) -> Record | None:
    """A row's fields keyed by the header (`extra_last`: see `tsv_records`), or None when the
    row is malformed (a wrong field count, a field too long), reported to `bad`."""
    if len(fields) != len(header) and not (extra_last and len(fields) > len(header)):
        bad.report(
            DataError(
                f"expected {len(header)} {separator}-separated fields "
                f"({', '.join(header)}), got {len(fields)}",
                path,
                lineno,
            )
        )
        return None
    record = dict(zip(header, fields))
    if extra_last:
        record[extra_last] = fields[-1]
    try:
        check_field_sizes(record, path, lineno)
    except DataError as exc:
        bad.report(exc)
        return None
    return record


STRAY_CR = "a carriage return (CR) inside a field that is not in quotes; remove it"


def csv_records(path: Path, bad: BadRows) -> Iterator[tuple[int, Record]]:
    """Records of a comma-separated file with a header line; quoted fields may span lines, and
    keep their line breaks (RFC 4180), so the lines go to the reader with their endings."""
    lines = numbered_lines(path, keep_endings=True)
    line_of = [0]

    def feed() -> Iterator[str]:
        for lineno, text in lines:
            line_of[0] = lineno
            yield text

    reader = csv.reader(feed())
    header: list[str] | None = None
    start = 1
    # the csv module's own limit (128 Ki characters by default) would refuse long fields with
    # its own message and no field name; check_field_sizes is the rule for every format
    limit = csv.field_size_limit(sys.maxsize)
    try:
        # a damaged header is refused even with --skip-bad-rows: no row can be read without it
        while (fields := _next_row(reader, path, start, bad if header else BadRows())) is not None:
            first, start = start, line_of[0] + 1
            if fields is _BAD_ROW:
                continue
            if header is None:
                header = fields
                check_header(header, path, first)
                continue
            if not fields:
                continue  # blank line
            record = _record(fields, header, "comma", path, first, bad)
            if record is not None:
                yield first, record
    finally:
        csv.field_size_limit(limit)
    if header is None:
        raise DataError("empty file (expected a header line)", path)


_BAD_ROW: list[str] = []  # `_next_row`'s answer for a row reported to `bad`


def _next_row(reader: Any, path: Path, start: int, bad: BadRows) -> list[str] | None:
    """The CSV reader's next row, None at the end, or `_BAD_ROW` for one the csv module refused
    (reported to `bad` as malformed, naming the line it starts on: the module resumes reading
    on the line after)."""
    try:
        return next(reader)
    except StopIteration:
        return None
    except csv.Error as exc:
        reason = STRAY_CR if "new-line character" in str(exc) else f"malformed CSV ({exc})"
        bad.report(DataError(reason, path, start))
        return _BAD_ROW


def jsonl_records(path: Path, bad: BadRows) -> Iterator[tuple[int, Record]]:
    """One JSON object per line; blank lines are ignored."""
    for lineno, line in numbered_lines(path):
        if not line.strip():
            continue
        try:
            obj = load_json(line, path, lineno)
            if not isinstance(obj, dict):
                raise DataError(f"expected a JSON object, got {type(obj).__name__}", path, lineno)
            check_field_sizes(obj, path, lineno)
        except DataError as exc:
            bad.report(exc)
            continue
        yield lineno, obj


def records(
    path: Path, bad: BadRows, names: list[str] | None = None, extra_last: str | None = None
) -> Iterator[tuple[int, Record]]:
    """Records of `path`, its format chosen by extension (.jsonl/.json), else a table whose
    separator `gpt1.tasks.files.delimiter_of` tells (.csv, .tsv, else the header line's)."""
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return jsonl_records(path, bad)
    if names is None and table_header(path)[1] == ",":
        return csv_records(path, bad)
    return tsv_records(path, bad, names=names, extra_last=extra_last)


def table_header(path: Path) -> tuple[list[str], str]:
    """The first line's fields of a table file and the separator they were split with
    (`gpt1.tasks.files.delimiter_of`)."""
    from gpt1.tasks.files import delimiter_of

    lines = numbered_lines(path)  # the same encoding checks as the rows
    try:
        first = next(lines, (1, ""))[1]
    finally:
        lines.close()
    separator = delimiter_of(path, first)
    try:
        fields = next(csv.reader([first])) if separator == "," and first else first.split("\t")
    except csv.Error:  # a stray CR in the header line: `csv_records` names it
        fields = first.split(",")
    return fields, separator


EMPTY_TEXT = "empty text (no printable character)"


def has_visible_text(value: str) -> bool:
    """Whether `value` holds a printable character other than whitespace: a text of spaces,
    control characters (NUL, ...) or other unprintables gives the model nothing to read."""
    return any(ch.isprintable() and not ch.isspace() for ch in value)


def text_field(record: Record, name: str, path: Path, line: int, allow_empty: bool = False) -> str:
    """A required text column; missing, non-string or (unless allowed) empty is malformed."""
    if name not in record or record[name] is None:
        raise DataError(missing_column(name, record), path, line, name)
    value = record[name]
    if not isinstance(value, str):
        raise DataError(f"expected text, got {type(value).__name__}", path, line, name)
    if not allow_empty and not has_visible_text(value):
        raise DataError(EMPTY_TEXT, path, line, name)
    return value


def missing_column(name: str, record: Record, what: str = "column") -> str:
    """ "missing column 'x' (this row has: a, b)": the message names the columns that exist."""
    present = ", ".join(str(k) for k in record if record[k] is not None) or "no columns"
    return f"missing {what} {name!r} (this row has: {present})"


def label_field(
    record: Record,
    name: str,
    path: Path,
    line: int,
    labels: list[str] | None,
    aliases: dict[str, str] | None = None,
    *,
    required: bool = True,
) -> int | float | None:
    """A class index (`labels` given) or a float score (`labels` None), from column `name`.

    Not `required` (prediction, which needs no labels), a label that does not read as one is
    None: a gold label never seen in training, or a blank one, must not stop a prediction."""
    if not required:
        try:
            return label_field(record, name, path, line, labels, aliases)
        except DataError:
            return None
    if name not in record or record[name] is None:
        raise DataError(missing_column(name, record, "label column"), path, line, name)
    value = record[name]
    if labels is None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            score = float(value)
        elif isinstance(value, str) and NUMBER.fullmatch(value.strip()):
            score = float(value)
        else:
            raise DataError(f"expected a number, got {value!r}", path, line, name)
        if not math.isfinite(score):  # an overflowing 1e999 would poison the loss silently
            raise DataError(f"score must be a finite number, got {value!r}", path, line, name)
        return score
    raw = label_text(value, path, line, name)
    key = (aliases or {}).get(raw, raw)
    if key not in labels:
        raise UnknownLabelError(
            f"unknown label {raw!r}; expected one of {', '.join(labels)}", path, line, name
        )
    return labels.index(key)


def label_text(value: Any, path: Path, line: int | None, name: str) -> str:
    """A class label as text: a string (stripped) or an integer (JSON 1 is the class "1");
    anything else (list, object, boolean, fraction) or an empty label is malformed."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise DataError(
            f"expected a label string or integer, got {type(value).__name__} "
            f"{json.dumps(value)[:60]}",
            path,
            line,
            name,
        )
    if not value.strip():
        raise DataError("empty label", path, line, name)
    return value.strip()


def collect(
    recs: Iterator[tuple[int, Record]], bad: BadRows, build: Builder
) -> tuple[list[Example], int]:
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
