"""Dataset loaders for gpt1's local lm-evaluation-harness tasks (the YAML files beside this one).

The harness calls a task's `custom_dataset` with the run's metadata: `gpt1 lm-eval --data DIR`
(or the harness's `--metadata '{"data": "DIR"}'`) names the data root (holding corpus/lambada,
glue/SST-2, story_cloze, ...) or one task's folder. The files are read by gpt1's own readers, so
what the harness scores is exactly what `gpt1 zeroshot` scores; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets

from gpt1.errors import DataError


def _folder(task: str, metadata: dict[str, Any]) -> Path:
    from gpt1.zeroshot.heuristics import TASKS, task_folder

    data = metadata.get("data")
    if not data:
        raise DataError(
            f"the {task} task reads local files: pass --data DIR to gpt1 lm-eval "
            '(or --metadata \'{"data": "DIR"}\' to the harness)'
        )
    folder = task_folder(task, Path(data))
    if folder is None:
        raise DataError(
            f"no {task} data here (looked for it and in {', '.join(TASKS[task].folders)})", data
        )
    return folder


def load_lambada(**metadata: Any) -> datasets.DatasetDict:
    """LAMBADA passages: `context` (all but the last word) and `word` (the last word)."""
    from gpt1.zeroshot.heuristics import TASKS

    loaded = TASKS["lambada"].load(_folder("lambada", metadata), None)
    rows = loaded["examples"]
    return datasets.DatasetDict(
        {
            "test": datasets.Dataset.from_dict(
                {"context": [c for c, _ in rows], "word": [w for _, w in rows]}
            )
        }
    )


def load_sst2(**metadata: Any) -> datasets.DatasetDict:
    """SST-2 dev (and train, for few-shot examples): `sentence`, `label` (0 negative, 1 positive)."""
    from gpt1.tasks.registry import get_task

    folder = _folder("sst2", metadata)
    out = {}
    for split in ("train", "dev"):
        examples = get_task("sst2").read(folder, split).examples
        out["validation" if split == "dev" else split] = datasets.Dataset.from_dict(
            {"sentence": [e.text for e in examples], "label": [int(e.label) for e in examples]}
        )
    return datasets.DatasetDict(out)


def load_story_cloze(**metadata: Any) -> datasets.DatasetDict:
    """Story Cloze test: `context` (the four sentences), `endings` (two), `label` (0 or 1)."""
    from gpt1.tasks.registry import get_task

    examples = get_task("story_cloze").read(_folder("story_cloze", metadata), "test").examples
    return datasets.DatasetDict(
        {
            "test": datasets.Dataset.from_dict(
                {
                    "context": [e.context for e in examples],
                    "endings": [list(e.choices) for e in examples],
                    "label": [int(e.label) for e in examples],
                }
            )
        }
    )
