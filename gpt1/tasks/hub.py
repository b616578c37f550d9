"""Hub datasets (`--data hf:glue/rte`) through Hugging Face `datasets`, only when asked for.

`datasets` is imported lazily; without it, or offline, the user gets one line saying so. The
hub's integer labels already follow GLUE's class order, which is the order of `Task.labels`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpt1.errors import DataError, Gpt1Error
from gpt1.tasks.examples import BadRows, ChoiceExample, Example, PairExample, TextExample

if TYPE_CHECKING:
    from gpt1.tasks.registry import Task

HUB_SPLITS = {"dev": "validation", "dev_matched": "validation_matched",
              "dev_mismatched": "validation_mismatched", "test_matched": "test_matched",
              "test_mismatched": "test_mismatched", "train": "train", "test": "test"}
FIRST = ("sentence", "text", "sentence1", "premise", "question", "question1")
SECOND = ("sentence2", "hypothesis", "sentence", "question2")


def _load(name: str, split: str) -> Any:
    try:
        import datasets  # noqa: F401  (optional dependency: the `hf` extra)
    except ImportError:
        raise Gpt1Error("hub datasets need the `datasets` package: pip install 'gpt1[hf]'") from None
    path, _, config = name.partition("/")
    try:
        return datasets.load_dataset(path, config or None, split=HUB_SPLITS.get(split, split))
    except Exception as exc:  # network, unknown name, missing split: all user-facing
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Gpt1Error(f"cannot load hub dataset {name!r} split {split!r} (offline?): {first}") from None


def _label(row: dict, task: "Task", where: str, index: int) -> int | float | None:
    value = row.get("label", row.get("answer"))
    if value is None or value == -1:
        return None
    if task.kind == "choice" and isinstance(value, str):
        return "ABCDEFGH".index(value.strip())
    if task.labels is None:
        return float(value)
    if not isinstance(value, int) or not 0 <= value < len(task.labels):
        raise DataError(f"unknown label {value!r}", where, index, "label")
    return value


def read_hub(task: "Task", name: str, split: str, bad: BadRows) -> tuple[list[Example], Path, int]:
    """Examples of one hub split, in the shape of `task`'s examples."""
    rows = _load(name, split)
    where = f"hf:{name}[{split}]"
    out: list[Example] = []
    for i, row in enumerate(rows, 1):
        first = next((row[k] for k in FIRST if k in row), None)
        label = _label(row, task, where, i)
        uid = str(row.get("idx", i))
        if task.kind == "choice":
            out.append(ChoiceExample(row.get("article", ""), row.get("question", ""),
                                     list(row.get("options", [])), label, uid))
        elif task.kind == "single":
            out.append(TextExample(first, label, uid))
        else:
            second = next((row[k] for k in SECOND if k in row and row[k] is not first), None)
            out.append(PairExample(first, second, label, uid))
    return out, Path(where), 0
