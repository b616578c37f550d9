"""Model checkpoint folders: the architecture table, one loader for every architecture, and save.

The folder format itself (weights, `config.json`, tokenizer files, pickle refusal, and
`open_checkpoint`, which reads a folder once) is `gpt1.checkpoint_files`, which knows no model
class. This module is where a folder becomes a model: `ARCHITECTURES` says, for each `"arch"`
name, which config class reads config.json's `"model"` table, which module class it builds and
how its memory is checked; `load_model` loads an opened folder through that table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpt1.checkpoint_files import (
    TASK_FILE,
    AnyCheckpoint,
    CheckpointFolder,
    load_weights,
    open_checkpoint,
    state_bytes,
    write_model_files,
)
from gpt1.config import ModelConfig, read_json_file
from gpt1.errors import CheckpointError, ConfigError, Gpt1Error
from gpt1.files import atomic_folder
from gpt1.model.gpt import GPT
from gpt1.model.lstm import LSTMLM, LSTMConfig
from gpt1.model.memory import ensure_lstm_fits, ensure_model_fits


@dataclass(frozen=True)
class Architecture:
    """What loading needs to know of one architecture."""

    config: type  # its config class: `from_dict` reads config.json's "model" table
    model: type  # its module class, built from that config
    ensure_fits: Callable[..., None]  # (config, source, device, extra_params): refuses


ARCHITECTURES = {  # by config.json's "arch" (`gpt1.checkpoint_files.ARCHS`)
    "gpt": Architecture(ModelConfig, GPT, ensure_model_fits),
    "lstm": Architecture(LSTMConfig, LSTMLM, ensure_lstm_fits),
}


def save_model(
    model: nn.Module,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Save `model` as a checkpoint folder, atomically (temporary name, then rename)."""
    out_dir = Path(out_dir)
    with atomic_folder(out_dir, needed=state_bytes(model.state_dict())) as tmp:
        write_model_files(tmp, model, tokenizer_dir, extra)
    return out_dir


def model_config(checkpoint: CheckpointFolder, arch: str | None = None) -> Any:
    """The config of an opened checkpoint, checked, as `arch`'s config class (by default the
    architecture the folder records: a `ModelConfig` for GPT)."""
    config_class = ARCHITECTURES[arch or checkpoint.arch].config
    try:
        return config_class.from_dict(
            checkpoint.config["model"], source=str(checkpoint.config_file)
        )
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


def load_model(
    checkpoint: CheckpointFolder,
    device: str | torch.device = "cpu",
    head_outputs: int = 0,
    arch: str | None = None,
) -> nn.Module:
    """The model of an opened checkpoint folder, on `device`, as the class its `"arch"` names
    (or `arch`). Its memory is checked from the config before anything is built, counting a
    task head of `head_outputs` outputs (a fine-tuned run's, checked with its body: the
    refusal then names task.json); its weights are checked against the model (`load_weights`)."""
    architecture = ARCHITECTURES[arch or checkpoint.arch]
    config = model_config(checkpoint, arch)
    source = checkpoint.folder / TASK_FILE if head_outputs else checkpoint.config_file
    head = (config.n_embd + 1) * head_outputs
    architecture.ensure_fits(config, str(source), device, extra_params=head)
    with torch.device("meta"):  # nothing allocated: the weights are assigned as loaded
        model = architecture.model(config)
    model.load_state_dict(load_weights(checkpoint, expect=model), assign=True)
    return model.to(device)  # (`to` also rebuilds nn.LSTM's flat view of the assigned weights)


def load_checkpoint(path: AnyCheckpoint, device: str | torch.device = "cpu") -> GPT:
    """Load a gpt1 checkpoint folder (or the newest checkpoint of a run folder, or a folder
    `open_checkpoint` opened) as a `GPT`."""
    return load_model(open_checkpoint(path), device, arch="gpt")


def run_checkpoints(run_dir: str | Path) -> list[tuple[str, int | None, Path]]:
    """(name, pretraining updates, folder) for every step-N and final checkpoint of a run, in
    update order; a `final` that repeats the last step-N is left out (same weights)."""
    run_dir = Path(run_dir)
    found = []
    for p in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        if not (p / "config.json").is_file() or p.name.startswith("."):
            continue
        m = re.fullmatch(r"step-(\d+)", p.name)
        if m:
            found.append((p.name, int(m.group(1)), p))
        elif p.name == "final":
            found.append((p.name, updates_of(p), p))
    if not found:
        raise CheckpointError(f"{run_dir}: no step-N or final checkpoints in this run folder")
    # `final` usually repeats the last step-N (same update count): score those weights once.
    steps = {c[1] for c in found if c[0] != "final"}
    found = [c for c in found if not (c[0] == "final" and c[1] is not None and c[1] in steps)]
    return sorted(found, key=lambda c: (c[1] is None, c[1] or 0, c[0]))


def updates_of(folder: Path) -> int | None:
    """The update count a checkpoint records (trainer_state.json, else config.json), if any."""
    for name in ("trainer_state.json", "config.json"):
        try:
            data = read_json_file(folder / name)
        except Gpt1Error:  # unreadable or not JSON: it records no count
            continue
        if not isinstance(data, dict):
            continue
        for table in (data, data.get("trainer") or {}):
            for key in ("step", "updates", "global_step"):
                # type(): a JSON true is not an update count
                if isinstance(table, dict) and type(table.get(key)) is int and table[key] >= 0:
                    return table[key]
    return None
