"""Resumable training state: optimizer <-> flat tensors, trainer_state files, step-N folders.

Written beside the weights of every `step-N` (and `final`) folder of a run: `save_checkpoint`
writes such a folder whole (the recipe's model files, then the trainer state) and prunes older
step folders. Which checkpoint a run resumes from is decided here too, once, as its folder is
claimed (`claim_for_resume`). Knows no model, task or text code: the training loop trains any
module.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpt1 import files
from gpt1.checkpoint_files import load_state_dict, save_tensors, state_bytes
from gpt1.config import read_json_file
from gpt1.errors import CheckpointError, ConfigError

TRAINER_TENSORS = "trainer_state.safetensors"
TRAINER_JSON = "trainer_state.json"


def optimizer_to_flat(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer `state_dict()` into safetensors-ready tensors and a JSON description."""
    tensors: dict[str, torch.Tensor] = {}
    entries = []
    for i, (key, values) in enumerate(state_dict["state"].items()):
        scalars = {}
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{i}/{name}"] = value.detach().to("cpu").contiguous()
            else:
                scalars[name] = value
        entries.append(
            {
                "key": key,
                "tensors": [n for n, v in values.items() if isinstance(v, torch.Tensor)],
                "scalars": scalars,
            }
        )
    return tensors, {"state": entries, "param_groups": state_dict["param_groups"]}


def optimizer_from_flat(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `optimizer_to_flat`: an optimizer `state_dict()` (tensors on CPU)."""
    state = {}
    for i, entry in enumerate(meta["state"]):
        values: dict[str, Any] = dict(entry["scalars"])
        for name in entry["tensors"]:
            values[name] = tensors[f"optim/{i}/{name}"]
        state[entry["key"]] = values
    return {"state": state, "param_groups": meta["param_groups"]}


def save_training_state(
    folder: Path, tensors: dict[str, torch.Tensor], info: dict[str, Any]
) -> None:
    """Write trainer tensors (optimizer moments, RNG states as uint8) and JSON state into `folder`."""
    save_tensors({k: v.contiguous() for k, v in tensors.items()}, Path(folder) / TRAINER_TENSORS)
    (Path(folder) / TRAINER_JSON).write_text(json.dumps(info) + "\n")


def save_checkpoint(
    folder: Path,
    model: nn.Module,
    write_model: Callable[[nn.Module, Path], None],
    tensors: dict[str, torch.Tensor],
    info: dict[str, Any],
    keep_last: int = 0,
) -> None:
    """Write a run's resumable checkpoint `folder` atomically: the model's files
    (`write_model(model, tmp)`) and the trainer state beside them; after a `step-N` folder,
    only the newest `keep_last` step folders stay (`prune_steps`). A failed write (disk full,
    read-only folder) leaves nothing half-written and is a CheckpointError naming the
    checkpoint that is still intact."""
    needed = state_bytes(model.state_dict()) + state_bytes(tensors)
    try:
        with files.atomic_folder(folder, needed=needed) as tmp:
            write_model(model, tmp)
            save_training_state(tmp, tensors, info)
    except files.WriteError as exc:  # older checkpoints are untouched
        raise CheckpointError(_write_failed_message(exc, folder)) from None
    if folder.name.startswith("step-"):
        prune_steps(folder.parent, keep_last)


def _write_failed_message(exc: files.WriteError, folder: Path) -> str:
    last = latest_resumable(folder.parent)
    fix = (
        "Free space"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT)
        else "Make the folder writable"
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        else "Fix the disk"
    )
    kept = (
        f"the last complete checkpoint {last} is intact" if last else "no earlier checkpoint exists"
    )
    return f"{exc}; {kept}. {fix}, then rerun with --resume auto"


def load_training_state(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and JSON state written by `save_training_state`."""
    folder = Path(folder)
    file = folder / TRAINER_JSON
    if not file.is_file():
        raise CheckpointError(
            f"{folder}: no {TRAINER_JSON}; this checkpoint cannot resume training "
            "(it holds weights only)"
        )
    info = read_trainer_json(folder)
    if not (
        isinstance(info.get("optimizer"), dict)
        and isinstance(info.get("sources"), list)
        and info["sources"]
    ):
        raise CheckpointError(
            f'{file}: damaged trainer state (expected "optimizer" and '
            '"sources" entries); resume from an older step-N folder'
        )
    return load_state_dict(folder / TRAINER_TENSORS), info


def recorded_threads(folder: str | Path) -> int | None:
    """The CPU thread count the run of checkpoint `folder` trained with (None where it was not
    recorded, or is not a positive integer)."""
    value = read_trainer_json(folder).get("threads")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def read_trainer_json(folder: str | Path) -> dict[str, Any]:
    """The parsed `trainer_state.json` of `folder`: a JSON object with a step >= 0."""
    file = Path(folder) / TRAINER_JSON
    try:
        info = read_json_file(file, CheckpointError, limit=64_000_000)
    except CheckpointError as exc:
        raise CheckpointError(
            f"{exc}; resume from an older step-N folder or delete this one"
        ) from None
    step = info.get("step") if isinstance(info, dict) else None
    if type(step) is not int or step < 0:
        raise CheckpointError(f'{file}: damaged trainer state ("step" must be an integer >= 0)')
    return info


def step_dirs(run_dir: str | Path) -> list[Path]:
    """`step-N` checkpoint folders of a run, oldest first (temporary folders excluded)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [
        p
        for p in run_dir.iterdir()
        if p.is_dir()
        and p.name.startswith("step-")
        and p.name[5:].isdigit()
        and (p / TRAINER_JSON).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest_resumable(run_dir: str | Path) -> Path | None:
    """The newest checkpoint of a run that carries trainer state (`step-N`, else `final`)."""
    steps = step_dirs(run_dir)
    final = Path(run_dir) / "final"
    candidates = steps + ([final] if (final / TRAINER_JSON).is_file() else [])
    if not candidates:
        return None
    return max(candidates, key=lambda p: read_trainer_json(p)["step"])


def resume_checkpoint(resume: str, run_dir: str | Path) -> Path | None:
    """The checkpoint `--resume` names: None without one, the newest resumable checkpoint of
    `run_dir` for `auto` (None when it has none: a new run), else the step-N folder given (or
    the newest one inside the run folder given)."""
    if not resume:
        return None
    if resume == "auto":
        return latest_resumable(run_dir)
    path = Path(resume)
    if not (path / TRAINER_JSON).is_file():
        found = latest_resumable(path) if path.is_dir() else None
        if found is None:
            raise ConfigError(
                f"--resume {resume}: no resumable checkpoint (step-N folder with "
                f"{TRAINER_JSON}) there"
            )
        return found
    return path


def resumes_in(folder: str | Path, resume: str | None) -> bool:
    """Whether `--resume` continues the run in `folder` (`auto`, or a checkpoint inside it),
    rather than starting a new run there from another run's checkpoint."""
    if not resume:
        return False
    if resume == "auto":
        return True
    return Path(resume).resolve().is_relative_to(Path(folder).resolve())


def claim_for_resume(
    out: Path,
    resume: str,
    overwrite: bool,
    *,
    inputs: Iterable[str | Path | None] = (),
    roots: Iterable[str | Path | None] = (),
    claim: bool = True,
) -> tuple[files.RunLock | None, Path | None]:
    """Claim the run folder `out` (`files.claim_run_dir`; no lock with `claim=False`) and
    decide the checkpoint the run resumes from (`resume_checkpoint`, called once): (the held
    lock or None, the checkpoint or None).

    Another run's checkpoint is an input of this one: it is resolved first and its files are
    checked against `out` with `inputs` and `roots`. This folder's own checkpoints are read
    once the lock is held, so that no other process writes them meanwhile."""
    continues = resumes_in(out, resume)
    resumed_from = None if continues else resume_checkpoint(resume, out)
    if resumed_from is not None:
        inputs = [*inputs, *files.folder_files(resumed_from)]
    lock = None
    if claim:
        lock = files.claim_run_dir(out, continues, overwrite, inputs=inputs, roots=roots)
    if not continues:
        return lock, resumed_from
    try:
        return lock, resume_checkpoint(resume, out)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def prune_steps(run_dir: str | Path, keep_last: int) -> None:
    """Keep the newest `keep_last` step-N folders (0 keeps all)."""
    if keep_last <= 0:
        return
    for old in step_dirs(run_dir)[:-keep_last]:
        # Rename, then delete: a kill mid-delete leaves a hidden folder, never a checkpoint
        # folder with some of its files gone.
        trash = old.with_name(f".{old.name}.deleting-{os.getpid()}")
        os.replace(old, trash)
        shutil.rmtree(trash, ignore_errors=True)
    # Leftovers of killed processes (half-written or half-deleted folders); one process writes
    # a run, so hidden step folders of other process ids are dead.
    for stale in Path(run_dir).glob(".step-*"):
        if stale.is_dir() and not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
