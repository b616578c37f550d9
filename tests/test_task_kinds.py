"""One definition of the task kinds (`gpt1.config.TaskKind`): readers, heads, task records and
the input transformations all name the same four kinds, by the same strings, and one table
(`gpt1.tasks.kinds.KINDS`) holds what else differs between them."""

import json

import pytest

from gpt1.config import TASK_KINDS, TaskKind, check_task_record
from gpt1.errors import ConfigError
from gpt1.model import heads
from gpt1.tasks import transforms
from gpt1.tasks.kinds import KINDS
from gpt1.tasks.registry import TASKS, get_task


def test_every_module_names_the_same_kinds():
    assert TASK_KINDS == ("single", "pair", "similarity", "choice")
    assert heads.KINDS is TASK_KINDS
    assert list(KINDS) == list(TaskKind)


def test_a_task_kind_is_a_member_whether_given_as_member_or_string():
    assert all(type(task.kind) is TaskKind for task in TASKS.values())
    spec = {
        "columns": {"a": "q1", "b": "q2", "label": "y"},
        "kind": "similarity",
        "labels": ["0", "1"],
    }
    assert get_task("csv", spec).kind is TaskKind.SIMILARITY


def test_a_kind_reads_and_writes_as_its_string():
    kind = TaskKind("similarity")
    assert kind == "similarity" and f"{kind}" == "similarity" and str(kind) == "similarity"
    assert json.loads(json.dumps({"kind": kind})) == {"kind": "similarity"}


def test_a_record_with_an_unknown_kind_names_the_four():
    with pytest.raises(ConfigError, match="kind must be single or pair or similarity or choice"):
        check_task_record({"task": "t", "kind": "regression"}, "task.json")


@pytest.mark.parametrize("kind", list(TaskKind))
def test_each_kind_has_its_transformation(kind):
    # The string a task record holds and the enum member choose the same transformation.
    from gpt1.tasks.examples import ChoiceExample, PairExample, TextExample
    from gpt1.tasks.transforms import SpecialIds

    example = {
        TaskKind.SINGLE: TextExample("a b", 0),
        TaskKind.PAIR: PairExample("a", "b", 0),
        TaskKind.SIMILARITY: PairExample("a", "b", 0),
        TaskKind.CHOICE: ChoiceExample("c", "", ["x", "y"], 0),
    }[kind]
    encode = lambda text: [ord(ch) for ch in text if ch != " "]
    ids = SpecialIds(start=1, delimiter=2, classify=3)
    by_member = transforms.transform(kind, example, encode, ids, 40)
    by_string = transforms.transform(kind.value, example, encode, ids, 40)
    assert by_member == by_string and len(by_member) == {"similarity": 2, "choice": 2}.get(kind, 1)
