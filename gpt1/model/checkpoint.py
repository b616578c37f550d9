"""GPT checkpoint folders: save a `GPT`, read its config, load it back (safetensors only).

The folder format itself (weights, `config.json`, tokenizer files, pickle refusal) is
`gpt1.checkpoint_files`, which knows no model class; its names are re-exported here because
this is where callers that load a GPT look for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpt1.checkpoint_files import (  # noqa: F401 (re-exported)
    CONFIG,
    FORMAT,
    FORMAT_VERSION,
    PICKLE_SUFFIXES,
    TOKENIZER_FILES,
    WEIGHTS,
    check_finite,
    check_state_dict,
    copy_tokenizer_files,
    load_state_dict,
    read_config,
    refuse_pickle,
    resolve_checkpoint_dir,
    state_bytes,
    tokenizer_dir_of,
    trained_context,
    write_model_files,
)
from gpt1.config import ModelConfig
from gpt1.errors import CheckpointError, ConfigError
from gpt1.files import atomic_dir, atomic_folder, follow_umask, publish_dir  # noqa: F401 (re-exported)
from gpt1.model.gpt import GPT, parameter_count
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


def read_model_config(path: str | Path) -> ModelConfig:
    folder = resolve_checkpoint_dir(path)
    try:
        return ModelConfig.from_dict(read_config(folder)["model"], source=str(folder / CONFIG))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


def check_weights_size(
    config: ModelConfig, files: list[Path], source: Path | str, min_bytes_per_param: int = 2
) -> None:
    """Refuse a config that describes more parameters than the weight files can hold.

    Checked from file sizes before anything is read or built, so a config.json edited to a
    huge size is refused at once even when the machine could hold the model.
    """
    need = parameter_count(config) * min_bytes_per_param
    have = sum(f.stat().st_size for f in files if f.is_file())
    if have < need:
        where = files[0] if len(files) == 1 else files[0].parent
        raise CheckpointError(
            f"{where}: {have:,} bytes of weights, but {source} describes "
            f"{parameter_count(config):,} parameters (at least {need:,} bytes): "
            "the weights are truncated, or config and weights do not belong "
            "together"
        )


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> GPT:
    """Load a gpt1 checkpoint folder (or the newest checkpoint of a run folder) as a `GPT`."""
    folder = resolve_checkpoint_dir(path)
    config = read_model_config(folder)
    weights = folder / WEIGHTS
    if not weights.is_file():
        pickles = [p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES]
        hint = f" (found {', '.join(pickles)}: pickles are never loaded)" if pickles else ""
        raise CheckpointError(f"{weights}: missing weights file{hint}")
    ensure_model_fits(config, str(folder / CONFIG), device)
    refuse_pickle(weights)
    check_weights_size(config, [weights], folder / CONFIG)
    state = load_state_dict(weights)
    with torch.device("meta"):
        model = GPT(config)
    check_state_dict(model, state, weights)
    model.load_state_dict(state, assign=True)
    return model.to(device)
