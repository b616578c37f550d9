"""GPT checkpoint folders: save a `GPT`, read its config, load it back (safetensors only).

The folder format itself (weights, `config.json`, tokenizer files, pickle refusal, and
`open_checkpoint`, which reads a folder once) is `gpt1.checkpoint_files`, which knows no model
class; its names are re-exported here because this is where callers that load a GPT look for
them. The loaders take a path or a folder already open (`opened`), never reading a file twice.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from gpt1.checkpoint_files import (  # noqa: F401 (re-exported)
    ARCH_KEY,
    ARCHS,
    CONFIG,
    FORMAT,
    FORMAT_VERSION,
    PICKLE_SUFFIXES,
    TOKENIZER_FILES,
    WEIGHTS,
    AnyCheckpoint,
    CheckpointFolder,
    check_finite,
    check_state_dict,
    check_weights_size,
    checked_weights,
    copy_tokenizer_files,
    load_state_dict,
    load_weights,
    open_checkpoint,
    read_config,
    refuse_pickle,
    resolve_checkpoint_dir,
    state_bytes,
    tokenizer_dir_of,
    trained_context,
    write_model_files,
)
from gpt1.config import ModelConfig, read_json_file
from gpt1.errors import CheckpointError, ConfigError, Gpt1Error
from gpt1.files import atomic_dir, atomic_folder, follow_umask, publish_dir  # noqa: F401 (re-exported)
from gpt1.model.gpt import GPT
from gpt1.model.memory import ensure_model_fits


def save_model(
    model: GPT,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Save `model` as a checkpoint folder, atomically (temporary name, then rename)."""
    out_dir = Path(out_dir)
    with atomic_folder(out_dir, needed=state_bytes(model.state_dict())) as tmp:
        write_model_files(tmp, model, tokenizer_dir, extra)
    return out_dir


def opened(path: AnyCheckpoint) -> CheckpointFolder:
    """`path` as an open checkpoint folder: the one given, or `open_checkpoint(path)` now."""
    return path if isinstance(path, CheckpointFolder) else open_checkpoint(path)


def read_model_config(path: AnyCheckpoint) -> ModelConfig:
    """The `ModelConfig` of a GPT checkpoint's config.json, checked."""
    checkpoint = opened(path)
    try:
        return ModelConfig.from_dict(checkpoint.config["model"], source=str(checkpoint.config_file))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


def load_checkpoint(path: AnyCheckpoint, device: str | torch.device = "cpu") -> GPT:
    """Load a gpt1 checkpoint folder (or the newest checkpoint of a run folder, or a folder
    `open_checkpoint` opened) as a `GPT`."""
    checkpoint = opened(path)
    config = read_model_config(checkpoint)
    ensure_model_fits(config, str(checkpoint.config_file), device)
    with torch.device("meta"):  # nothing allocated: the weights are assigned as loaded
        model = GPT(config)
    model.load_state_dict(load_weights(checkpoint, expect=model), assign=True)
    return model.to(device)


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
