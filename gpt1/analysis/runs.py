"""One fine-tuning sub-run of an analysis, as the exact `gpt1 finetune` command it is.

A sweep never calls fine-tuning internals with settings of its own: it builds the argv of a
`gpt1 finetune` command, records it (commands.txt), runs it in this process through the CLI's own
parser, and reads the run's `results.json`. So every number in an analysis table can be reproduced
by pasting one line of commands.txt. This module also reads a run's headline metric (the task's
first metric; the mean over several dev files such as MNLI matched/mismatched) and scores a
fine-tuned run on (a sample of) its training examples for the train curve of Fig. 2 (left).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt1.errors import ConfigError, DataError

log = logging.getLogger(__name__)


@dataclass
class FinetuneOptions:
    """Settings every sub-run of a sweep shares (passed through to `gpt1 finetune`)."""

    max_steps: int | None = None
    epochs: float | None = None
    batch_size: int | None = None
    micro_batch: int | None = None
    lr: float | None = None
    n_ctx: int | None = None
    precision: str | None = None
    sets: list[str] = field(default_factory=list)
    quiet: bool = False

    def argv(self) -> list[str]:
        out: list[str] = []
        for name in ("max_steps", "epochs", "batch_size", "micro_batch", "lr", "n_ctx", "precision"):
            value = getattr(self, name)
            if value is not None:
                out += ["--" + name.replace("_", "-"), str(value)]
        for assignment in self.sets:
            out += ["--set", assignment]
        return out + (["--quiet"] if self.quiet else [])

    def settings(self) -> dict[str, Any]:
        """What defines the sweep's results (quietness does not)."""
        return {k: v for k, v in vars(self).items() if k != "quiet"}


def finetune_argv(task: str, data: str | Path, init: str | Path, out: str | Path,
                  options: FinetuneOptions, *, seed: int, transfer_layers: int | None = None,
                  lm_coef: float | None = None, train_split: str | None = None,
                  eval_split: str | None = None, train_examples: int | None = None) -> list[str]:
    """The exact `gpt1 finetune` command line of one sub-run."""
    argv = ["gpt1", "finetune", "--task", task, "--data", str(data), "--init", str(init),
            "--out", str(out), "--seed", str(seed)]
    if transfer_layers is not None:
        argv += ["--transfer-layers", str(transfer_layers)]
    if lm_coef is not None:
        argv += ["--lm-coef", str(lm_coef)]
    if train_split is not None:
        argv += ["--train-split", train_split]
    if eval_split is not None:
        argv += ["--eval-split", eval_split]
    if train_examples is not None:
        argv += ["--train-examples", str(train_examples)]
    return argv + options.argv()


def execute(argv: list[str]) -> dict[str, Any]:
    """Run a `gpt1 ...` command line in this process; return its run folder's results.json.

    Errors propagate as exceptions (the sweep stops, the finished sub-runs stay recorded).
    """
    from gpt1.cli import build_parser

    if argv[:1] != ["gpt1"]:
        raise ValueError(f"not a gpt1 command: {argv}")
    args = build_parser().parse_args(argv[1:])
    args.debug = getattr(args, "debug", False)
    args.quiet = getattr(args, "quiet", False)
    code = int(args._run(args) or 0)
    if code != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited with status {code}")
    results_file = Path(args.out) / "results.json"
    if not results_file.is_file():
        raise DataError("the fine-tuning run wrote no results.json (was --eval-split empty?)",
                        results_file)
    return json.loads(results_file.read_text())


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


def train_metric(run: str | Path, data: str | Path, train_split: str, limit: int, seed: int = 0,
                 train_examples: int | None = None, micro: int = 16) -> dict[str, Any]:
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
        examples = [examples[i] for i in sorted(random.Random(0).sample(range(len(examples)), limit))]
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
