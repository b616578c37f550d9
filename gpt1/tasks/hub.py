"""Hub datasets (`--data hf:glue/rte`) through Hugging Face `datasets`, only when asked for.

`datasets` is imported lazily; without it, or offline, the user gets one line saying so. The
hub's integer labels already follow GLUE's class order, which is the order of a task's `labels`.
The reader is given a task's kind and labels, never the task itself: the task table
(`gpt1.tasks.registry`) imports this module, not the other way round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt1.errors import DataError, Gpt1Error
from gpt1.extras import require
from gpt1.tasks.examples import BadRows, Example
from gpt1.tasks.kinds import example
from gpt1.tasks.rows import check_field_sizes, label_field, text_field

HUB_SPLITS = {
    "dev": "validation",
    "dev_matched": "validation_matched",
    "dev_mismatched": "validation_mismatched",
    "test_matched": "test_matched",
    "test_mismatched": "test_mismatched",
    "train": "train",
    "test": "test",
}
LETTERS = "ABCDEFGH"
FIRST = ("sentence", "text", "sentence1", "premise", "question", "question1")
SECOND = ("sentence2", "hypothesis", "sentence", "question2")


def _load(name: str, split: str) -> Any:
    require("hf", "datasets", what=f"{name}: a hub dataset")
    import datasets

    path, _, config = name.partition("/")
    try:
        return datasets.load_dataset(path, config or None, split=HUB_SPLITS.get(split, split))
    except Exception as exc:  # network, unknown name, missing split: all user-facing
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Gpt1Error(
            f"cannot load hub dataset {name!r} split {split!r} (offline?): {first}"
        ) from None


def _label(
    row: dict, kind: str, labels: list[str] | None, where: str, index: int
) -> int | float | None:
    name = "label" if "label" in row else "answer"
    value = row.get(name)
    if value is None or (isinstance(value, (int, float)) and value == -1):  # hub: "no label"
        return None
    if kind == "choice" and isinstance(value, str):
        letter = value.strip()
        if len(letter) != 1 or letter not in LETTERS:
            raise DataError(f"unknown answer {value!r}; expected a letter A-H", where, index, name)
        return LETTERS.index(letter)
    if labels is None:  # a finite score, as in the file readers
        return label_field(row, name, where, index, None)  # type: ignore[arg-type]
    if type(value) is not int or not 0 <= value < len(labels):
        raise DataError(f"unknown label {value!r}", where, index, name)
    return value


def _text(row: dict, names: tuple[str, ...], where: str, index: int, skip: Any = None) -> str:
    name = next((k for k in names if k in row and row[k] is not skip), None)
    if name is None:
        raise DataError(f"no text column (looked for {', '.join(names)})", where, index)
    return text_field(row, name, where, index)  # type: ignore[arg-type]


def read_hub(
    kind: str, labels: list[str] | None, name: str, split: str, bad: BadRows
) -> tuple[list[Example], Path, int]:
    """Examples of one hub split, in the shape of a task's examples: `kind` ("single", "pair",
    "choice", ...) and `labels` (the class names in order, None for a score) are the task's."""
    rows = _load(name, split)
    where = f"hf:{name}[{split}]"
    out: list[Example] = []
    for i, row in enumerate(rows, 1):
        try:
            row = dict(row)
            check_field_sizes(row, where, i)  # type: ignore[arg-type]
            label = _label(row, kind, labels, where, i)
            uid = str(row.get("idx", i))
            if kind == "choice":
                options = row.get("options")
                if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
                    raise DataError("expected a list of option strings", where, i, "options")
                values = {
                    "context": text_field(row, "article", where, i),  # type: ignore[arg-type]
                    "question": text_field(row, "question", where, i, allow_empty=True),  # type: ignore[arg-type]
                    "choices": options,
                }
            elif kind == "single":
                values = {"text": _text(row, FIRST, where, i)}
            else:
                first = _text(row, FIRST, where, i)
                key = next(k for k in FIRST if k in row)
                values = {"a": first, "b": _text(row, SECOND, where, i, skip=row[key])}
            out.append(example(kind, values, label, uid))
        except DataError as exc:
            bad.report(exc)
    return out, Path(where), 0
