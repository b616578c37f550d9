"""What differs between task kinds besides their transformation (`transforms.py`) and head
(`gpt1.model.heads`), one row per kind: `KINDS[kind]` (see `KindFacts`). `example` builds a
kind's example from its roles' values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpt1.config import TaskKind
from gpt1.tasks.examples import ChoiceExample, Example, PairExample, TextExample

# Every role an example's inputs fill, in the order records and requests list them.
INPUT_ROLES = ("text", "a", "b", "context", "question", "choices")


@dataclass(frozen=True)
class KindFacts:
    roles: tuple[str, ...]  # the example roles a user's --columns must name
    fields: dict[str, str]  # a built-in task's request fields -> example roles
    sequences: int | None  # input sequences per example; None: one per answer
    layout: str  # one example's input, as the exports describe it
    formula: str  # what the head computes from the states at _classify_
    choice: bool = False  # the model scores each answer; its outputs have no class names


_CLASSES = "logits = h @ weight.T + bias, h the last layer's state at _classify_"
KINDS: dict[TaskKind, KindFacts] = {
    TaskKind.SINGLE: KindFacts(
        ("text",), {"text": "text"}, 1, "[_start_] text [_classify_]", _CLASSES
    ),
    TaskKind.PAIR: KindFacts(
        ("a", "b"),
        {"premise": "a", "hypothesis": "b"},
        1,
        "[_start_] premise [_delimiter_] hypothesis [_classify_]",
        _CLASSES,
    ),
    TaskKind.SIMILARITY: KindFacts(
        ("a", "b"),
        {"sentence1": "a", "sentence2": "b"},
        2,
        "[_start_] a [_delimiter_] b [_classify_] and [_start_] b [_delimiter_] a [_classify_]",
        "output = (h_ab + h_ba) @ weight.T + bias: the states at _classify_ of both orders are "
        "added first",
    ),
    TaskKind.CHOICE: KindFacts(
        ("context", "choices"),
        {"context": "context", "question": "question", "choices": "choices"},
        None,
        "[_start_] context question [_delimiter_] answer_k [_classify_], one per answer",
        "score_k = h_k @ weight.T + bias per answer; softmax over the answers",
        choice=True,
    ),
}


def example(kind: str, values: dict[str, Any], label: Any = None, uid: str = "") -> Example:
    """The example of a task of `kind` whose roles hold `values` (text; a, b; context, optional
    question, choices)."""
    if kind == TaskKind.SINGLE:
        return TextExample(values["text"], label, uid)
    if kind in (TaskKind.PAIR, TaskKind.SIMILARITY):
        return PairExample(values["a"], values["b"], label, uid)
    question = values.get("question", "")
    return ChoiceExample(values["context"], question, list(values["choices"]), label, uid)
