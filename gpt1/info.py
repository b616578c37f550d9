"""`gpt1 info`: describe a preset or a checkpoint without loading its weights."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt1.config import MODEL_PRESETS, model_preset
from gpt1.model import flops_per_token, parameter_count


def describe(model: str, seq_len: int | None = None) -> dict[str, Any]:
    """Config, parameter counts and training FLOPs per token of a preset or checkpoint."""
    if model in MODEL_PRESETS and not (Path(model) / "config.json").exists():
        config, source = model_preset(model), f"preset {model}"
    else:
        from gpt1.checkpoint import read_model_config, resolve_checkpoint_dir
        folder = resolve_checkpoint_dir(model)
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
