"""A user's own data: CSV, TSV or JSON Lines files named by columns.

`columns` maps roles to column names: `text` (single text); `a` and `b` (pair: entailment-style,
or similarity with kind "similarity"); `context`, optional `question` and `choices` (multiple
choice: several columns joined by `|`, or one column holding a JSON list); and `label`.
Class names come from `labels` or, when not given, are the sorted distinct values of the
training file's label column (recorded with the fine-tuned run so evaluation maps them the same
way). Regression tasks read the label as a float. Files are `{split}.csv|.tsv|.jsonl`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt1.errors import ConfigError, DataError
from gpt1.tasks.examples import BadRows, Example
from gpt1.tasks.kinds import INPUT_ROLES, KINDS, example
from gpt1.tasks.rows import (
    NUMBER,
    Record,
    collect,
    has_visible_text,
    label_field,
    label_text,
    missing_column,
    records,
    text_field,
)


def parse_columns(spec: str) -> dict[str, str]:
    """`"a=question1,b=question2,label=is_duplicate"` -> a role -> column mapping."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        role, sep, column = part.partition("=")
        role, column = role.strip(), column.strip()
        if not sep or not column:
            raise ConfigError(f"--columns: expected ROLE=COLUMN, got {part!r}")
        if role in out:
            raise ConfigError(f"--columns: {role} given twice ({out[role]!r}, then {column!r})")
        out[role] = column
    return out


def infer_kind(columns: dict[str, str], similarity: bool = False) -> str:
    """The example kind implied by the roles present in `columns`."""
    known = {*INPUT_ROLES, "label", "id"}
    unknown = sorted(set(columns) - known)
    if unknown:
        raise ConfigError(
            f"--columns: unknown role(s) {', '.join(unknown)}; "
            f"known roles are {', '.join(sorted(known))}"
        )
    if "choices" in columns:
        kind = "choice"
    elif "a" in columns or "b" in columns:
        kind = "similarity" if similarity else "pair"
    elif "text" in columns:
        kind = "single"
    else:
        raise ConfigError(
            "--columns must name text=COL, or a=COL,b=COL, or context=COL,choices=COL|COL"
        )
    missing = [r for r in KINDS[kind].roles if r not in columns]
    if missing:
        raise ConfigError(f"--columns: a {kind} task also needs {', '.join(missing)}=COLUMN")
    label = columns.get("label")
    for role, column in columns.items():
        if role not in ("label", "id") and label in str(column).split("|"):
            raise ConfigError(
                f"--columns: {label!r} is both the label and an input ({role}): the model "
                "would read the answer it is to predict"
            )
    return kind


def scan_labels(path: Path, column: str) -> list[str]:
    """Sorted distinct values of `column` in `path` (the training file): the class names."""
    values = set()
    for line, rec in records(path, BadRows(skip=True)):  # bad rows are reported when read
        if column not in rec or rec[column] is None:
            raise DataError(missing_column(column, rec, "label column"), path, line, column)
        values.add(label_text(rec[column], path, line, column))
    if not values:
        raise DataError("no rows to take the label set from", path)
    return sorted(values, key=lambda v: (not _is_number(v), float(v) if _is_number(v) else 0, v))


def _is_number(value: str) -> bool:
    return bool(NUMBER.fullmatch(value))  # a decimal number: not "nan", "inf" or "1_000"


def _choices(rec: Record, spec: str, path: Path, line: int) -> list[str]:
    names = spec.split("|")
    if len(names) == 1:
        value = rec.get(names[0])
        if not isinstance(value, list) or not all(
            isinstance(v, str) and has_visible_text(v) for v in value
        ):
            raise DataError("expected a list of non-empty answer strings", path, line, names[0])
        return list(value)
    return [text_field(rec, n, path, line) for n in names]


def read_generic(
    path: Path, spec: dict[str, Any], bad: BadRows, need_labels: bool
) -> tuple[list[Example], int]:
    """Examples of a user file described by `spec` (kind, columns, labels)."""
    cols, kind, labels = spec["columns"], spec["kind"], spec.get("labels")
    has_label = "label" in cols

    def build(line: int, rec: Record) -> Example:
        label = None
        if has_label:  # prediction (not need_labels): a label is kept where it reads
            label = label_field(rec, cols["label"], path, line, labels, required=need_labels)
        uid = (
            label_text(rec[cols["id"]], path, line, cols["id"])
            if "id" in cols and rec.get(cols["id"]) is not None
            else str(line)
        )
        values = {}
        if KINDS[kind].choice and "question" in cols:  # the optional role, read first
            values["question"] = text_field(rec, cols["question"], path, line, allow_empty=True)
        for role in KINDS[kind].roles:
            read = _choices if role == "choices" else text_field
            values[role] = read(rec, cols[role], path, line)
        return example(kind, values, label, uid)

    if need_labels and not has_label:
        raise ConfigError("--columns needs label=COLUMN for training and evaluation")
    return collect(records(path, bad), bad, build)


def spec_from_flags(
    columns: str | None,
    labels: str | None = None,
    regression: bool = False,
    similarity: bool = False,
    positive_label: str | None = None,
) -> dict[str, Any] | None:
    """A csv/tsv/jsonl task's spec from `--columns ROLE=COL,...`, `--labels L1,L2,...` and
    `--positive-label L` (None without columns: a registered task)."""
    if not columns:
        return None
    spec: dict[str, Any] = {
        "columns": parse_columns(columns),
        "regression": regression,
        "similarity": similarity,
    }
    if labels:
        spec["labels"] = [x.strip() for x in labels.split(",") if x.strip()]
    if positive_label is not None:
        spec["positive_label"] = positive_label.strip()
    return spec
