"""A training run opened in one place: what pretraining and fine-tuning decide before any data
is read or any model is built, decided once and handed to the trainer.

`with open_run(out, cfg, ...) as run:` checks the trackers' packages (before anything is
touched), claims and locks the run folder and decides which checkpoint the run resumes from in
one call (`gpt1.train.state.claim_for_resume`, the only caller of `resume_checkpoint`), resolves
the device (this process's GPU under torchrun) and precision, and fixes the CPU thread count for
the whole run (a resumed run takes the count it started with). The `OpenedRun` it yields holds
these decisions; leaving the block closes the trackers and releases the lock. `RunSpec` is what
a recipe decides after opening, from its data and model: run.json, the resolved settings, and
the functions that write, read and evaluate its model.

Knows no model, task or text code: the training loop trains any module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpt1 import files, threads
from gpt1.config import TrainConfig
from gpt1.devices import TRAIN_PRECISIONS, resolve_device, resolve_precision
from gpt1.train import distributed as dist
from gpt1.train import state as train_state
from gpt1.train.trackers import Trackers


@dataclass
class OpenedRun:
    """A run folder claimed for this process, with everything decided about the run before it
    trains (what `open_run` yields)."""

    out: Path  # locked by the main process while the `with` block lasts (unless unclaimed)
    resumed_from: Path | None  # the checkpoint the run continues from, None for a new run
    device: torch.device
    precision: str  # fp32 or bf16 (autocast)
    threads: int  # the CPU thread count, fixed for the whole run
    trackers: Trackers  # packages checked; started by the trainer once every check passed
    # What a new run found in its folder (`files.entries`; None for a resumed run and on the
    # other ranks): a run refused in its first update gives the folder back as it was.
    found: dict[Path, Any] | None
    outcome: str = "FAILED"  # set by the trainer when it returns: FINISHED or KILLED


@dataclass(frozen=True)
class RunSpec:
    """What a recipe hands the trainer besides the model, loss, data and settings, decided
    from its data and model after the run was opened."""

    config: dict | None = None  # resolved settings: trainer_state's "config", trackers' config
    record: dict | None = None  # RUN/run.json, written once every check of the run has passed
    eval_fn: Callable[[Any], dict] | None = None  # periodic evaluation of the model view
    write_model: Callable[[nn.Module, Path], None] | None = None  # a checkpoint's model files
    read_model: Callable[[nn.Module, Path], None] | None = None  # their inverse, on a resume
    flops_per_token: float | None = None  # for MFU (default: the model's own count, if any)


@contextlib.contextmanager
def open_run(
    out: str | Path,
    cfg: TrainConfig,
    *,
    overwrite: bool = False,
    inputs: Iterable[str | Path | None] = (),
    roots: Iterable[str | Path | None] = (),
    command: str | None = None,
    claim: bool = True,
) -> Iterator[OpenedRun]:
    """Open the training run in `out` with the settings `cfg` (its resume, device, precision
    and loggers), for a `with` block; see the module docstring.

    A non-empty `out` is continued only with `cfg.resume`, started over only with `overwrite`,
    and may never be or hold one of `inputs` or `roots` (what the run reads; a checkpoint of
    another run resumed from is added here). `claim=False` opens a folder its caller manages
    itself (a program calling the trainer directly): no lock, no folder policy. `command` is
    the command line the tracker runs record. Every refusal comes before anything is written.
    Leaving the block closes the trackers with the run's `outcome` (FAILED on an exception)
    and releases the folder (a lock whose run wrote nothing removes what it made)."""
    out = Path(out)
    trackers = Trackers(
        out,
        cfg.loggers,
        command=command,
        project=cfg.tracker_project,
        mlflow_uri=cfg.mlflow_uri,
    )
    info = dist.env_info()
    lock, resumed_from = train_state.claim_for_resume(
        out,
        cfg.resume,
        overwrite,
        inputs=inputs,
        roots=roots,
        claim=claim and info.is_main,
    )
    status = "FAILED"
    try:
        device = resolve_device(cfg.device, local_rank=info.local_rank)
        precision = resolve_precision(cfg.precision, device, TRAIN_PRECISIONS)
        # One thread count for the whole run (and the one it started with, on a resume): the
        # last bits of the gradients depend on it, so following the machine's load would
        # change them.
        recorded = train_state.recorded_threads(resumed_from) if resumed_from else None
        count = threads.pin_for_training(recorded)
        found = None
        if resumed_from is None and info.is_main:  # the claim noted it; else a folder as it is
            found = lock.found if lock is not None else files.entries(out)
        run = OpenedRun(out, resumed_from, device, precision, count, trackers, found)
        yield run
        status = run.outcome
    finally:
        try:
            trackers.close(status)
        finally:
            if lock is not None:
                lock.release()
