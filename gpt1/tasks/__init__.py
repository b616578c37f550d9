"""Fine-tuning tasks: readers for each dataset format, the paper's four input transformations,
the task registry and GLUE-style metrics."""

from gpt1.tasks.examples import ChoiceExample, Example, PairExample, Split, TextExample
from gpt1.tasks.registry import TASKS, Task, get_task, task_names

__all__ = [
    "TextExample",
    "PairExample",
    "ChoiceExample",
    "Example",
    "Split",
    "Task",
    "TASKS",
    "get_task",
    "task_names",
]
