"""`gpt1 predict --format jsonl|csv`: one record per example with its inputs, the predicted label
and the probability of every class (or choice).

A record holds `id`, the example's inputs under their roles (`text`; `a`, `b`; `context`,
`question`, `choices`), `label` (written as in the GLUE-style TSV: the class label, Story Cloze's
1-based ending, RACE's letter), `gold` when the file has a label for the row, and
`probabilities`: class label -> softmax probability for classification, one per choice (in file
order) for multiple choice. Regression tasks write `score` instead of both. Classification
records also carry `label_name` (and `gold_name`): what the class means, as the task table names
it (SST-2's `1` is `positive`), else the label itself. CSV flattens the same record: one column
per input role, `label`, `label_name`, `gold`, `gold_name`, then `p_<class>` (or `p_1`, `p_2`,
... per choice), or `score`.

CSV cells are neutralised against spreadsheet formula injection as OWASP recommends ("CSV
Injection"): a text cell starting with `=`, `+`, `-`, `@`, a tab or a carriage return gets a
single quote in front (`'=1+1`), so that a spreadsheet shows it as text instead of running it; a
cell that is a plain number (`-1`, `+0.5`) is left as it is. `raw=True` (`--raw-csv`) writes
every cell as it is. JSONL is always raw.
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

import torch

from gpt1.inference.prediction import label_text
from gpt1.tasks.examples import Example
from gpt1.tasks.kinds import INPUT_ROLES
from gpt1.tasks.registry import Task

FORMATS = ("tsv", "jsonl", "csv")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # OWASP's list
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def probabilities(raw: list[list[float]]) -> list[list[float]]:
    """Softmax of each example's class logits or choice scores (the head's raw outputs)."""
    if not raw:
        return []
    return torch.softmax(torch.tensor(raw, dtype=torch.float64), dim=-1).tolist()


def records(task: Task, examples: list[Example], raw: list[Any]) -> list[dict[str, Any]]:
    """The prediction record of each example (see the module docstring), in file order."""
    probs = None if task.regression else probabilities(raw)
    classes = not task.is_choice and task.labels is not None  # they have names
    out = []
    for i, example in enumerate(examples):
        rec: dict[str, Any] = {"id": example.uid}
        rec.update({r: getattr(example, r) for r in INPUT_ROLES if hasattr(example, r)})
        if task.regression:
            rec["score"] = raw[i]
        else:
            best = max(range(len(probs[i])), key=probs[i].__getitem__)
            rec["label"] = label_text(task, best)
            if classes:
                rec["label_name"] = task.label_name(best)
        if example.label is not None:
            rec["gold"] = label_text(task, example.label)
            if classes:
                rec["gold_name"] = task.label_name(example.label)
        if probs is not None:
            rec["probabilities"] = _named(task, probs[i])
        out.append(rec)
    return out


def _named(task: Task, row: list[float]) -> dict[str, float] | list[float]:
    if task.is_choice or not task.labels:
        return row
    return dict(zip(task.labels, row))


def to_jsonl(recs: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)


def to_csv(recs: list[dict[str, Any]], raw: bool = False) -> str:
    """The records as CSV (RFC 4180, text quoted): inputs, label, gold, one column per probability;
    text cells that a spreadsheet would read as a formula are neutralised unless `raw`."""
    flat = [_flatten(r) for r in recs]
    if not raw:
        flat = [{k: neutralised(v) for k, v in row.items()} for row in flat]
    columns: dict[str, None] = {}
    for row in flat:
        columns.update(dict.fromkeys(row))
    buffer = io.StringIO()
    # text quoted, numbers not (OWASP's advice too): a bare carriage return in a text cell
    # would otherwise be written unquoted (only "\n" is the line terminator) and split the row
    writer = csv.DictWriter(
        buffer, fieldnames=list(columns), lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC
    )
    writer.writeheader()
    writer.writerows(flat)
    return buffer.getvalue()


def neutralised(cell: Any) -> Any:
    """`cell` with a single quote in front when it is text a spreadsheet would run as a formula
    (it starts with one of `FORMULA_START` and is not a plain number)."""
    if isinstance(cell, str) and cell.startswith(FORMULA_START) and not _NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def _flatten(rec: dict[str, Any]) -> dict[str, Any]:
    row = {k: v for k, v in rec.items() if k != "probabilities"}
    if isinstance(row.get("choices"), list):
        row["choices"] = json.dumps(row["choices"], ensure_ascii=False)
    probs = rec.get("probabilities")
    if isinstance(probs, dict):
        row.update({f"p_{name}": p for name, p in probs.items()})
    elif isinstance(probs, list):
        row.update({f"p_{k + 1}": p for k, p in enumerate(probs)})
    return row
