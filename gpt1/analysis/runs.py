"""One fine-tuning sub-run of an analysis, and what a sweep reads from it.

A sweep never calls fine-tuning internals with settings of its own: each sub-run is a
`gpt1.recipes.commands.FinetuneRun`, the settings of one `gpt1 finetune` command. The sweep
records that command (commands.txt), runs the same settings through the fine-tuning recipe in
this process, and reads the run's `results.json`. So every number in an analysis table can be
reproduced by pasting one line of commands.txt. This module also reads a run's headline metric
(the task's first metric; the mean over several dev files such as MNLI matched/mismatched) and
scores a fine-tuned run on (a sample of) its training examples for the train curve of Fig. 2 (left).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path
from typing import Any

from gpt1.errors import ConfigError, DataError
from gpt1.recipes.commands import FinetuneOptions, FinetuneRun

__all__ = [
    "FinetuneOptions",
    "FinetuneRun",
    "headline",
    "parse_ints",
    "TaskSweep",
    "train_metric",
    "training_subset",
]

log = logging.getLogger(__name__)


def headline(task_name: str, results: dict[str, Any]) -> tuple[str, float]:
    """(metric name, value) of a results.json: the task's first metric, averaged over dev files."""
    from gpt1.tasks.registry import get_task

    metric = get_task(task_name).metrics[0]
    per_file = [v[metric] for v in results.values() if isinstance(v, dict) and metric in v]
    if per_file:  # e.g. MNLI: the paper's column is about the mean of matched and mismatched
        return metric, float(sum(per_file) / len(per_file))
    if metric not in results:
        raise DataError(f"results have no {metric!r} (keys: {', '.join(sorted(results))})")
    return metric, float(results[metric])


@dataclasses.dataclass(frozen=True)
class TaskSweep:
    """What one task's sub-runs in a sweep hold fixed (data size, layers, an ablations row): the
    checkpoint, the task and its splits, the fine-tuning options; `sub_run` gives the rest."""

    init: str | Path
    task: str
    data: str | Path
    train_split: str
    eval_split: str
    options: FinetuneOptions

    def settings(self, **more: Any) -> dict[str, Any]:
        """sweep.json's settings, which a later invocation into the folder must match: these,
        with the analysis's own `more`."""
        return {
            "init": str(self.init),
            "task": self.task,
            "data": str(self.data),
            "train_split": self.train_split,
            "eval_split": self.eval_split,
            **more,
            "finetune": self.options.settings(),
        }

    def sub_run(self, out: Path, seed: int, **varied: Any) -> FinetuneRun:
        """The sub-run into `out`: these settings, `seed`, and the FinetuneRun fields `varied`."""
        return FinetuneRun(
            self.task,
            self.data,
            self.init,
            out,
            self.options,
            seed=seed,
            train_split=self.train_split,
            eval_split=self.eval_split,
            **varied,
        )


def train_metric(
    run: str | Path,
    data: str | Path,
    train_split: str,
    limit: int,
    seed: int = 0,
    train_examples: int | None = None,
    micro: int = 16,
) -> dict[str, Any]:
    """Score a fine-tuned run on up to `limit` of the training examples it was trained on."""
    from gpt1.recipes.evaluate import score
    from gpt1.recipes.finetune import encode_split, load_finetuned, resolve_task

    model, record, tok = load_finetuned(run)
    task = resolve_task(record["task"], record.get("spec") or None, str(data), train_split)
    split = task.read(str(data), train_split)
    examples = split.examples
    if train_examples:
        examples = [examples[i] for i in training_subset(len(examples), train_examples, seed)]
    if len(examples) > limit:
        # A fixed sample (seed 0), so every K of a sweep is scored on the same examples.
        examples = [
            examples[i] for i in sorted(random.Random(0).sample(range(len(examples)), limit))
        ]
    sample = dataclasses.replace(split, examples=examples, skipped=[])
    enc = encode_split(sample, task, tok, record["n_ctx"], record.get("question_delimiter", False))
    return score(model, task, enc, micro)


def training_subset(n: int, k: int, seed: int) -> list[int]:
    """Indices of the `k` training examples a run with `--train-examples k --seed seed` uses."""
    from gpt1.recipes.finetune import train_subset

    return train_subset(n, k, seed)


def parse_ints(spec: str, name: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; a ConfigError naming the option otherwise."""
    try:
        values = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{name}: expected comma-separated integers, got {spec!r}") from None
    if not values:
        raise ConfigError(f"{name}: empty list")
    return values
