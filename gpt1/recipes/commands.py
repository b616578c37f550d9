"""A fine-tuning run described once: called as a function, and recorded as its `gpt1` command.

The demo and the analysis sweeps fine-tune by calling `gpt1.recipes.finetune` with a resolved
config; they never build argv for the command line to parse. For people, the same settings also
give the exact `gpt1 finetune` command line that reproduces the run (`FinetuneRun.argv`): the
sweeps write it to commands.txt, the demo logs it. Both come from the fields of one
`FinetuneRun`, and `flags()` fills the same tables the command line's flags fill, so pasting the
command gives the same run.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt1.errors import DataError, Gpt1Error


@dataclass
class FinetuneOptions:
    """Settings every sub-run of a sweep shares (the `gpt1 finetune` flags of the same names)."""

    max_steps: int | None = None
    epochs: float | None = None
    batch_size: int | None = None
    micro_batch: int | None = None
    lr: float | None = None
    n_ctx: int | None = None
    precision: str | None = None
    sets: list[str] = field(default_factory=list)
    quiet: bool = False
    loggers: list[str] = field(default_factory=list)  # trackers: one tracker run per sub-run

    def argv(self) -> list[str]:
        out: list[str] = []
        for name in (
            "max_steps",
            "epochs",
            "batch_size",
            "micro_batch",
            "lr",
            "n_ctx",
            "precision",
        ):
            value = getattr(self, name)
            if value is not None:
                out += ["--" + name.replace("_", "-"), str(value)]
        for assignment in self.sets:
            out += ["--set", assignment]
        for name in self.loggers:
            out += ["--logger", name]
        return out + (["--quiet"] if self.quiet else [])

    def settings(self) -> dict[str, Any]:
        """What defines the sweep's results (quietness and trackers do not)."""
        return {k: v for k, v in vars(self).items() if k not in ("quiet", "loggers")}


@dataclass
class FinetuneRun:
    """One fine-tuning run: `run()` performs it, `argv()` is the equivalent command line."""

    task: str
    data: str | Path
    init: str | Path
    out: str | Path
    options: FinetuneOptions
    seed: int
    transfer_layers: int | None = None
    lm_coef: float | None = None
    train_split: str | None = None
    eval_split: str | None = None
    train_examples: int | None = None
    columns: str | None = None  # csv/tsv/jsonl tasks: ROLE=COL,... as `--columns`
    labels: str | None = None  # csv/tsv/jsonl tasks: L1,L2,... as `--labels`
    resume: str | None = None

    def argv(self) -> list[str]:
        """The exact `gpt1 finetune` command line of this run."""
        argv = ["gpt1", "finetune", "--task", self.task, "--data", str(self.data)]
        for flag, value in (("--columns", self.columns), ("--labels", self.labels)):
            if value:
                argv += [flag, value]
        argv += ["--init", str(self.init), "--out", str(self.out), "--seed", str(self.seed)]
        for flag, value in (
            ("--transfer-layers", self.transfer_layers),
            ("--lm-coef", self.lm_coef),
            ("--train-split", self.train_split),
            ("--eval-split", self.eval_split),
            ("--train-examples", self.train_examples),
            ("--resume", self.resume),
        ):
            if value is not None:
                argv += [flag, str(value)]
        return argv + self.options.argv()

    def flags(self) -> dict[str, dict[str, Any]]:
        """The config tables `gpt1 finetune` fills from the flags of `argv()` (None = not given)."""
        o = self.options
        return {
            "finetune": {
                "task": self.task,
                "data": str(self.data),
                "init": str(self.init),
                "lm_coef": self.lm_coef,
                "transfer_layers": self.transfer_layers,
                "n_ctx": o.n_ctx,
                "train_split": self.train_split,
                "eval_split": self.eval_split,
                "train_examples": self.train_examples,
            },
            "train": {
                "max_steps": o.max_steps,
                "epochs": o.epochs,
                "micro_batch_size": o.micro_batch,
                "batch_size": o.batch_size,
                "lr": o.lr,
                "resume": self.resume,
                "seed": self.seed,
                "precision": o.precision,
                "quiet": True if o.quiet else None,
                "loggers": ",".join(["jsonl", *o.loggers]) if o.loggers else None,
            },
        }

    def spec(self) -> dict[str, Any] | None:
        """A csv/tsv/jsonl task's spec, as `--columns` / `--labels` give it."""
        from gpt1.tasks.generic import spec_from_flags

        return spec_from_flags(self.columns, self.labels)

    def run(self) -> dict[str, Any]:
        """Fine-tune and evaluate in this process; return the run folder's results.json.

        Errors propagate as exceptions; an interrupted run is a `Gpt1Error`."""
        from gpt1.recipes.finetune import finetune, resolve

        cfg, train_cfg = resolve(None, self.flags(), self.options.sets)
        # --max-steps has one meaning everywhere: train.max_steps, the run's length in updates.
        result, _ = finetune(cfg, train_cfg, self.out, self.spec(), command=shlex.join(self.argv()))
        if result.interrupted:
            raise Gpt1Error(
                f"`{' '.join(self.argv())}` was interrupted (signal {int(result.interrupted)})"
            )
        results_file = Path(self.out) / "results.json"
        if not results_file.is_file():
            raise DataError(
                "the fine-tuning run wrote no results.json (was --eval-split empty?)", results_file
            )
        return json.loads(results_file.read_text())
