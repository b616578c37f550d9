"""What a resumed run may change, checked before anything is written, and how it is recorded.

A resume continues one run: the checkpoint's weights, optimizer moments, data cursor and RNG were
made by one configuration, and continuing them under another (other data, task, model, learning
rate, batch or seed) would give a run that no configuration describes. So a resume compares the
settings it resolves with those the checkpoint records (its `trainer_state.json`; the run's
`run.json` for checkpoints that carry none) and accepts a difference only in `CHANGEABLE`:
settings of how long and where the run goes on, never of what it computes. Anything else is
refused in one line naming the setting, the recorded value and the requested one. Accepted
changes are appended to `run.json`'s `resumes` list (step, checkpoint, what changed). The recipe
hands run.json to the trainer (`gpt1.train.run.RunSpec.record`), which writes it atomically once
everything else a resume checks has passed too: the batch arithmetic, the checkpoint's weights
and trainer state, the data cursor against the data, and the trackers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpt1.config import read_json_file
from gpt1.errors import ConfigError
from gpt1.train import state as train_state

# Settings a resume may change: length, checkpoints and logging, and where/how fast it runs.
CHANGEABLE: dict[str, str] = {
    "train.max_steps": "run length",
    "train.epochs": "run length",
    "train.save_every": "checkpoint interval",
    "train.keep_last": "checkpoints kept",
    "train.eval_every": "evaluation interval",
    "train.log_every": "logging interval",
    "train.device": "device",
    "train.precision": "precision",
    "train.compile": "torch.compile",
    "train.gradient_checkpointing": "activation checkpointing (same gradients)",
    "train.distributed": "DDP or FSDP2",
    "train.micro_batch_size": "micro-batch (same global batch)",
    "train.loss_chunk_tokens": "loss chunking (same loss)",
    "train.peak_flops": "MFU denominator",
    "train.quiet": "console output",
    "train.loggers": "experiment trackers (one added on a resume is sent the run's history)",
    "train.tracker_project": "experiment-tracker project",
    "train.mlflow_uri": "MLflow store",
    "finetune.encode_processes": "encoding processes",
    "data.workers": "tokenizing processes of a text stream (the same ids)",
}
# How the command was started, not what the run is.
IGNORED = {"train.resume", "resumes"}
RESUMES = "resumes"
RUN_JSON = "run.json"  # a run's settings and resumes, written by the trainer once all checks pass


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1}} -> {"train.lr": 1} (values JSON-normalised: tuples are lists)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = json.loads(json.dumps(value))
    return out


def _same(key: str, old: Any, new: Any, paths: frozenset[str]) -> bool:
    if old == new:
        return True
    if key in paths and isinstance(old, str) and isinstance(new, str) and old and new:
        try:  # the same folder named from another working directory or through a symlink
            return os.path.samefile(old, new)
        except OSError:
            return False
    return False


def recorded_config(checkpoint: Path, run_json: Path) -> tuple[dict[str, Any], Path]:
    """The configuration the checkpoint was made with, and the file it was read from."""
    config = train_state.read_trainer_json(checkpoint).get("config")
    if isinstance(config, dict):
        return config, checkpoint / train_state.TRAINER_JSON
    if run_json.is_file():
        recorded = read_json_file(run_json, ConfigError)
        if isinstance(recorded, dict):
            return recorded, run_json
    return {}, checkpoint / train_state.TRAINER_JSON


def changes(
    recorded: dict[str, Any],
    requested: dict[str, Any],
    source: Path,
    *,
    fixed: frozenset[str] = frozenset(),
    paths: frozenset[str] = frozenset(),
    origin: dict[str, str] | None = None,
    also: frozenset[str] = frozenset(),
) -> dict[str, list[Any]]:
    """{setting: [recorded, requested]} for the accepted differences; raises `ConfigError` on the
    first other one. Only settings in both are compared (a caller may check the sections it
    knows early, the rest later). `fixed` removes settings from `CHANGEABLE` for this run and
    `also` adds some (a data folder moved, where the checkpoint's digest of the data checks
    what is read); `origin` says where a requested value came from (named in the refusal)."""
    old, new = flatten(recorded), flatten(requested)
    accepted: dict[str, list[Any]] = {}
    # Settings both sides know: one the checkpoint does not record (a setting added to gpt1
    # since, or a section checked later) cannot be compared, so it is not refused.
    for key in sorted(set(old) & set(new)):
        if key in IGNORED:
            continue
        before, after = old[key], new[key]
        if _same(key, before, after, paths):
            continue
        if (key in CHANGEABLE and key not in fixed) or key in also:
            accepted[key] = [before, after]
            continue
        where = f" ({origin[key]})" if origin and key in origin else ""
        raise ConfigError(
            f"{key}: the run being resumed has {before!r} ({source}), this command asks for "
            f"{after!r}{where}; a resume may change only the run length, checkpoint, "
            "evaluation and logging intervals, and the device and speed settings. Repeat the "
            "run's own setting, or start a new run in another --out"
        )
    return accepted


def run_record(
    resolved: dict[str, Any],
    checkpoint: Path | None,
    run_json: Path,
    accepted: dict[str, list[Any]],
) -> dict[str, Any]:
    """What run.json holds: `resolved`, plus the earlier resumes and (when resuming) this one."""
    if checkpoint is None:
        return resolved
    earlier: list[Any] = []
    if run_json.is_file():
        previous = read_json_file(run_json, ConfigError)
        if isinstance(previous, dict) and isinstance(previous.get(RESUMES), list):
            earlier = previous[RESUMES]
    entry = {
        "step": train_state.read_trainer_json(checkpoint)["step"],
        "from": str(checkpoint),
        "changed": {key: {"was": a, "now": b} for key, (a, b) in accepted.items()},
    }
    return {**resolved, RESUMES: [*earlier, entry]}
