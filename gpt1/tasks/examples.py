"""The three kinds of task example, a read split, and the bookkeeping of skipped rows.

Labels are already mapped: a class index (`int`) for classification, a `float` for regression
(STS-B), `None` for unlabelled test rows. `uid` is the row's id in its file (GLUE's `index`
column where there is one), used to write submission files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpt1.errors import DataError

Label = int | float | None


@dataclass
class TextExample:
    """One text to classify (CoLA, SST-2)."""

    text: str
    label: Label = None
    uid: str = ""


@dataclass
class PairExample:
    """Two texts: premise/hypothesis for entailment, A/B for similarity."""

    a: str
    b: str
    label: Label = None
    uid: str = ""


@dataclass
class ChoiceExample:
    """A context, an optional question and the candidate answers (Story Cloze, RACE)."""

    context: str
    question: str
    choices: list[str]
    label: Label = None
    uid: str = ""


Example = TextExample | PairExample | ChoiceExample


class UnknownLabelError(DataError):
    """A label outside the task's label set: always an error, even with --skip-bad-rows,
    because it usually means the wrong task or file rather than one damaged row."""


@dataclass
class BadRows:
    """Where malformed rows go: raised at once, or (with `skip`) counted and kept for the report."""

    skip: bool = False
    rows: list[DataError] = field(default_factory=list)

    def report(self, error: DataError) -> None:
        if self.skip and isinstance(error, UnknownLabelError):
            raise UnknownLabelError(
                f"{error.reason} (--skip-bad-rows skips damaged rows, never a label outside the "
                "task's set: that usually means another task's file)",
                error.path,
                error.line,
                error.field,
            )
        if not self.skip:
            raise error
        self.rows.append(error)


@dataclass
class Split:
    """The examples of one split of one task, read from `path`."""

    name: str
    path: Path
    examples: list[Example]
    skipped: list[DataError] = field(default_factory=list)
    dropped: int = 0  # rows left out on purpose: SNLI "-" gold labels, other RACE levels

    @property
    def labelled(self) -> bool:
        return bool(self.examples) and all(e.label is not None for e in self.examples)

    def __len__(self) -> int:
        return len(self.examples)
