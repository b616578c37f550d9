"""The task registry: a task = reader + input transformation + head + metrics.

`get_task(name)` returns a `Task`; `task.read(data, split)` returns a `Split` of examples.
`kind` (a `TaskKind`) selects the transformation (`transforms.py`), the head
(`gpt1.model.heads`) and the rest of what differs between kinds (`kinds.KINDS`): single
(classification), pair (entailment), similarity (both orders summed) and choice (multiple
choice). `labels` None means regression (STS-B). `names` says what each class means where the
labels are codes (SST-2's "1" is positive); predictions show both. `folders` and `submission`
say where a data root holds the task and what `gpt1 predict` names its files.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt1.config import TASK_KINDS, TaskKind
from gpt1.errors import ConfigError, DataError
from gpt1.tasks import choice, generic, glue, nli
from gpt1.tasks.examples import BadRows, Example, Split
from gpt1.tasks.files import find_split_file
from gpt1.tasks.hub import read_hub
from gpt1.tasks.kinds import KINDS

Reader = Callable[["Task", Path, str, BadRows, bool], tuple[list[Example], Path, int]]


@dataclass
class Task:
    """Everything that makes one fine-tuning task."""

    name: str
    kind: TaskKind
    labels: list[str] | None  # class names; None = regression
    metrics: tuple[str, ...]  # first one is the task's headline metric
    reader: Reader
    splits: tuple[str, ...] = ("train", "dev", "test")
    dev: tuple[str, ...] = ("dev",)  # what `--split dev` evaluates (MNLI: both dev sets)
    test: tuple[str, ...] = ("test",)
    spec: dict[str, Any] = field(default_factory=dict)  # generic tasks: format, columns, labels
    folders: tuple[str, ...] = ()  # standard subfolders of a data root holding the task
    names: tuple[str, ...] | None = None  # each class's meaning, by label; None: labels are words
    # `gpt1 predict`'s file name: GLUE's for the task, or per split (MNLI's); default the task's
    submission: str | dict[str, str] | None = None

    @property
    def is_choice(self) -> bool:
        """The model scores each answer: its outputs are choices, not named classes."""
        return KINDS[self.kind].choice

    @property
    def n_outputs(self) -> int:
        """Width of the head's linear layer: classes, 1 for regression, 1 per choice."""
        if self.is_choice or self.labels is None:
            return 1
        return len(self.labels)

    @property
    def positive_index(self) -> int:
        """The class F1 is computed for: the spec's `positive_label`, else the second class
        (index 1: "1" for MRPC/QQP, the later of two sorted user labels, e.g. "pos" of neg/pos)."""
        name = self.spec.get("positive_label")
        return self.labels.index(name) if name and self.labels else 1

    @property
    def f1_label(self) -> str | None:
        """The name of the class F1 is computed for (None when the task reports no F1)."""
        return self.labels[self.positive_index] if "f1" in self.metrics and self.labels else None

    def label_name(self, index: int) -> str:
        """What class `index` means to a person: its name, else its label (already a word)."""
        return (self.names or self.labels or [])[index]

    @property
    def regression(self) -> bool:
        return not self.is_choice and self.labels is None

    def resolve_splits(self, split: str) -> tuple[str, ...]:
        """`dev`/`test` may stand for several files (MNLI matched and mismatched); any other
        name is one split, found by file name like the task's own (`held_out` -> held_out.tsv)."""
        if split == "dev":
            return self.dev
        if split == "test":
            return self.test
        check_split_name(split)
        return (split,)

    def read(
        self,
        data: str | Path,
        split: str,
        skip_bad_rows: bool = False,
        need_labels: bool | None = None,
    ) -> Split:
        """Read one split (an exact split name: the task's own or any file name stem) from
        folder (or file) `data`. Empty is an error."""
        check_split_name(split)
        if need_labels is None:
            need_labels = not split.startswith("test")
        bad = BadRows(skip=skip_bad_rows)
        if isinstance(data, str) and data.startswith("hf:"):
            examples, path, dropped = read_hub(self.kind, self.labels, data[3:], split, bad)
        else:
            examples, path, dropped = self.reader(self, Path(data), split, bad, need_labels)
        if not examples:
            raise DataError(
                f"split {split!r} of task {self.name} is empty"
                + (f" ({len(bad.rows)} malformed rows skipped)" if bad.rows else ""),
                path,
            )
        if need_labels and any(e.label is None for e in examples):
            raise DataError(f"split {split!r} has examples without labels; cannot score it", path)
        if self.is_choice:
            counts = {len(e.choices) for e in examples}  # type: ignore[union-attr]
            if len(counts) != 1:
                raise DataError(
                    f"examples have different numbers of choices ({sorted(counts)})", path
                )
        return Split(split, path, examples, skipped=bad.rows, dropped=dropped)


def check_split_name(split: str) -> None:
    """A split name becomes part of file names (`{split}.tsv`, `results.{split}.json`): letters,
    digits, `_`, `-` and inner dots only, so it never names a path outside the data folder."""
    if not SPLIT_NAME.fullmatch(split):
        raise ConfigError(
            f"split name {split!r}: use letters, digits, '_', '-' or '.' (to read a file by "
            "its path, give --file PATH)"
        )


SPLIT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


# ----------------------------------------------------------------------------- readers
def _glue_reader(
    key: str, files: dict[str, list[str]] | None = None, aliases: dict[str, str] | None = None
) -> Reader:
    def read(task: Task, data: Path, split: str, bad: BadRows, need_labels: bool):
        names = (files or {}).get(split, [f"{split}.tsv"])
        path = find_split_file(data, split, names)
        examples, dropped = glue.read_glue_tsv(
            path, glue.GLUE_COLUMNS[key], task.labels, bad, need_labels, aliases
        )
        return examples, path, dropped

    return read


def _nli_reader(
    candidates: Callable[[str], list[str]], aliases: dict[str, str] | None = None
) -> Reader:
    def read(task: Task, data: Path, split: str, bad: BadRows, need_labels: bool):
        path = find_split_file(data, split, candidates(split))
        examples, dropped = nli.read_nli_file(
            path, task.name, task.labels or [], bad, need_labels, aliases
        )
        return examples, path, dropped

    return read


def _story_cloze_reader(task: Task, data: Path, split: str, bad: BadRows, need_labels: bool):
    if split not in task.splits and not Path(data).is_file():
        raise DataError(
            f"no split {split!r}: a Story Cloze folder holds train and dev (OpenAI's split of "
            "the validation file) and test; give another file in its format with --file",
            data,
        )
    names = choice.STORY_CLOZE_TEST if split == "test" else choice.STORY_CLOZE_VAL
    path = find_split_file(data, split, names)
    examples, dropped = choice.read_story_cloze(path, bad)
    if split != "test" and not Path(data).is_file():
        examples = choice.story_cloze_split(examples, split)
    return examples, path, dropped


def _race_reader(levels: tuple[str, ...]) -> Reader:
    def read(task: Task, data: Path, split: str, bad: BadRows, need_labels: bool):
        data = Path(data)
        if data.is_file() or (data / f"{split}.jsonl").is_file():
            path = data if data.is_file() else data / f"{split}.jsonl"
            examples, dropped = choice.read_race_jsonl(path, levels, bad)
            return examples, path, dropped
        folder = data / split if (data / split).is_dir() else data / "RACE" / split
        examples, dropped = choice.read_race(folder, levels, bad)
        return examples, folder, dropped

    return read


def _generic_reader(task: Task, data: Path, split: str, bad: BadRows, need_labels: bool):
    fmt = task.spec.get("format", "csv")
    exts = {"csv": ["csv", "tsv"], "tsv": ["tsv"], "jsonl": ["jsonl", "json"]}[fmt]
    path = find_split_file(data, split, [f"{split}.{e}" for e in exts])
    examples, dropped = generic.read_generic(path, task.spec, bad, need_labels)
    return examples, path, dropped


# ---------------------------------------------------------------------------- registry
BINARY = ["0", "1"]
# GLUE's names for its 0/1 labels (the GLUE server and its TSVs take the digits).
SST2_NAMES, COLA_NAMES = ("negative", "positive"), ("unacceptable", "acceptable")
MRPC_NAMES, QQP_NAMES = ("not_equivalent", "equivalent"), ("not_duplicate", "duplicate")
WNLI_NAMES = ("not_entailment", "entailment")
NOT_ENT = ["entailment", "not_entailment"]
ACC, F1_ACC, MCC, CORR = ("accuracy",), ("f1", "accuracy"), ("matthews",), ("pearson", "spearman")
MNLI_SPLITS = ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched")


# MRPC as GLUE ships it, or as Microsoft's own download names its files.
MRPC_FILES = {
    "train": ["train.tsv", "msr_paraphrase_train.txt"],
    "dev": ["dev.tsv"],
    "test": ["test.tsv", "msr_paraphrase_test.txt"],
}


SINGLE, PAIR, SIMILARITY, CHOICE = TaskKind


def _glue(name: str, glue: str, kind: TaskKind, labels, metrics, names=None, files=None) -> Task:
    """A GLUE task: its TSV files under a data root's glue/<GLUE's name> (or <GLUE's name>, or
    the task's name), its predictions in GLUE's file name (CoLA.tsv)."""
    reader, folders = _glue_reader(name, files), (f"glue/{glue}", glue, name)
    return Task(name, kind, labels, metrics, reader, folders=folders, names=names, submission=glue)


def _race(name: str, levels: tuple[str, ...], folders: tuple[str, ...] = ()) -> Task:
    return Task(name, CHOICE, None, ACC, _race_reader(levels), folders=folders)


def _builtin() -> dict[str, Task]:
    return {
        t.name: t
        for t in [
            _glue("cola", "CoLA", SINGLE, BINARY, MCC + ("accuracy",), COLA_NAMES),
            _glue("sst2", "SST-2", SINGLE, BINARY, ACC, SST2_NAMES),
            Task(
                "mnli",
                PAIR,
                nli.NLI_LABELS,
                ACC,
                _nli_reader(nli.mnli_candidates),
                splits=MNLI_SPLITS,
                dev=("dev_matched", "dev_mismatched"),
                test=("test_matched", "test_mismatched"),
                folders=("glue/MNLI",),
                submission={"test_matched": "MNLI-m", "test_mismatched": "MNLI-mm"},
            ),
            Task(
                "snli",
                PAIR,
                nli.NLI_LABELS,
                ACC,
                _nli_reader(nli.snli_candidates),
                folders=("snli",),
            ),
            Task(
                "scitail",
                PAIR,
                nli.SCITAIL_LABELS,
                ACC,
                _nli_reader(nli.scitail_candidates, nli.SCITAIL_ALIASES),
                folders=("scitail",),
            ),
            _glue("qnli", "QNLI", PAIR, NOT_ENT, ACC),
            _glue("rte", "RTE", PAIR, NOT_ENT, ACC),
            _glue("wnli", "WNLI", PAIR, BINARY, ACC, WNLI_NAMES),
            _glue("mrpc", "MRPC", SIMILARITY, BINARY, F1_ACC, MRPC_NAMES, MRPC_FILES),
            _glue("qqp", "QQP", SIMILARITY, BINARY, F1_ACC, QQP_NAMES),
            _glue("stsb", "STS-B", SIMILARITY, None, CORR),
            Task(
                "story_cloze",
                CHOICE,
                None,
                ACC,
                _story_cloze_reader,
                folders=("story_cloze", "ROCStories"),
                submission="ROCStories",
            ),
            _race("race", ("middle", "high"), ("race", "RACE")),
            _race("race_middle", ("middle",)),
            _race("race_high", ("high",)),
        ]
    }


TASKS: dict[str, Task] = _builtin()
GENERIC = ("csv", "tsv", "jsonl")
ALIASES = {
    "sst-2": "sst2",
    "sts-b": "stsb",
    "storycloze": "story_cloze",
    "rocstories": "story_cloze",
    "multinli": "mnli",
    "race-m": "race_middle",
    "race-h": "race_high",
}


def task_names() -> list[str]:
    return list(TASKS) + list(GENERIC)


def get_task(name: str, spec: dict[str, Any] | None = None) -> Task:
    """A registered task by name, or a generic csv/tsv/jsonl task built from `spec`."""
    key = ALIASES.get(name.lower(), name.lower())
    if key in TASKS:
        return TASKS[key]
    if key in GENERIC:
        return generic_task(key, spec or {})
    raise ConfigError(f"unknown task {name!r}; choose one of {', '.join(task_names())}")


def generic_task(fmt: str, spec: dict[str, Any]) -> Task:
    """A user task: `spec` has `columns` (role -> column), optional `kind`, `labels`, `regression`."""
    columns = spec.get("columns") or {}
    if not columns:
        raise ConfigError(f"task {fmt} needs --columns (for example text=sentence,label=label)")
    kind = spec.get("kind") or generic.infer_kind(columns, spec.get("similarity", False))
    if kind not in TASK_KINDS:
        raise ConfigError(f"unknown kind {kind!r}; choose one of {', '.join(TASK_KINDS)}")
    regression = bool(spec.get("regression"))
    if regression and kind == CHOICE:
        raise ConfigError("a multiple-choice task cannot be a regression")
    labels = None if regression else spec.get("labels")
    if not regression and not labels:
        raise ConfigError(
            f"task {fmt}: class labels unknown (give --labels, or fine-tune: the "
            "training file's label values are then recorded)"
        )
    metrics = (
        CORR if regression else ACC if kind == CHOICE or len(labels or []) != 2 else F1_ACC + MCC
    )
    full = {
        "format": fmt,
        "kind": kind,
        "columns": columns,
        "labels": labels,
        "regression": regression,
    }
    positive = spec.get("positive_label")
    if positive is not None:
        _check_positive(positive, labels, "f1" in metrics)
        full["positive_label"] = positive
    return Task(fmt, TaskKind(kind), labels, metrics, _generic_reader, spec=full)


def _check_positive(name: str, labels: list[str] | None, has_f1: bool) -> None:
    if not has_f1:
        raise ConfigError(
            f"--positive-label {name}: only a two-class task reports F1 (this one has "
            f"{'no classes' if not labels else f'{len(labels)} classes'})"
        )
    if name not in (labels or []):
        raise ConfigError(
            f"--positive-label {name!r} is not one of the classes ({', '.join(labels or [])})"
        )


def complete_generic_spec(
    fmt: str, spec: dict[str, Any], data: str | Path, train_split: str
) -> dict[str, Any]:
    """Fill a generic spec's class labels from the training file when the user gave none."""
    columns = spec.get("columns") or {}
    kind = spec.get("kind") or generic.infer_kind(columns, spec.get("similarity", False))
    if spec.get("labels") or spec.get("regression") or "label" not in columns:
        return dict(spec, kind=kind)
    exts = {"csv": ["csv", "tsv"], "tsv": ["tsv"], "jsonl": ["jsonl", "json"]}[fmt]
    path = find_split_file(Path(data), train_split, [f"{train_split}.{e}" for e in exts])
    return dict(spec, kind=kind, labels=generic.scan_labels(path, columns["label"]))
