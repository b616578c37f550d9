"""`gpt1 info`: describe a preset or a checkpoint without loading its weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpt1.checkpoint_files import read_config, resolve_checkpoint_dir
from gpt1.config import MODEL_PRESETS, model_preset
from gpt1.errors import CheckpointError, ConfigError
from gpt1.model.checkpoint import read_model_config
from gpt1.model.gpt import flops_per_token, parameter_count
from gpt1.model.lstm import LSTMLM, LSTMConfig
from gpt1.model.registry import checkpoint_arch, model_flops


def describe(model: str, seq_len: int | None = None) -> dict[str, Any]:
    """Config, parameter counts and training FLOPs per token of a preset or checkpoint."""
    if model in MODEL_PRESETS and not (Path(model) / "config.json").exists():
        config, source = model_preset(model), f"preset {model}"
    else:
        folder = resolve_checkpoint_dir(model)
        if checkpoint_arch(folder) != "gpt":
            return _describe_lstm(folder, seq_len)
        config, source = read_model_config(folder), str(folder)
    T = seq_len or config.n_positions
    return {
        "source": source,
        "config": config.to_dict(),
        "parameters": parameter_count(config),
        "parameters_without_embeddings": parameter_count(config, exclude_embeddings=True),
        "seq_len": T,
        "flops_per_token": flops_per_token(config, T),
    }


def _describe_lstm(folder: Path, seq_len: int | None) -> dict[str, Any]:
    """The LSTM baseline (gpt1.model.lstm): counted on the meta device, nothing allocated."""
    import torch

    try:
        config = LSTMConfig.from_dict(
            read_config(folder)["model"], source=str(folder / "config.json")
        )
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    with torch.device("meta"):
        lstm = LSTMLM(config)
    T = seq_len or config.n_positions
    return {
        "source": str(folder),
        "arch": "lstm",
        "config": dataclasses.asdict(config),
        "parameters": lstm.num_parameters(),
        "parameters_without_embeddings": lstm.num_parameters(exclude_embeddings=True),
        "seq_len": T,
        "flops_per_token": model_flops(lstm, T),
    }
