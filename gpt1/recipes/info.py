"""`gpt1 info`: describe a preset or a checkpoint (and a fine-tuned one's task) without loading
its weights, and (`--kernels`) which implementation runs each product on this CPU;
`gpt1 kernels build`: build gpt1's compiled kernel now."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpt1.checkpoint_files import CheckpointFolder, open_checkpoint
from gpt1.config import MODEL_PRESETS, model_preset
from gpt1.errors import CheckpointError, ConfigError
from gpt1.model.checkpoint import model_config
from gpt1.model.gpt import flops_per_token, parameter_count
from gpt1.model.lstm import LSTMLM, LSTMConfig
from gpt1.model.registry import model_flops


def describe(model: str, seq_len: int | None = None) -> dict[str, Any]:
    """Config, parameter counts and training FLOPs per token of a preset or checkpoint."""
    checkpoint = None
    if model in MODEL_PRESETS and not (Path(model) / "config.json").exists():
        config, source = model_preset(model), f"preset {model}"
    else:
        checkpoint = open_checkpoint(model)
        if checkpoint.arch != "gpt":
            return _describe_lstm(checkpoint, seq_len)
        config, source = model_config(checkpoint), str(checkpoint.folder)
    T = seq_len or config.n_positions
    out = {
        "source": source,
        "config": config.to_dict(),
        "parameters": parameter_count(config),
        "parameters_without_embeddings": parameter_count(config, exclude_embeddings=True),
        "seq_len": T,
        "flops_per_token": flops_per_token(config, T),
    }
    if checkpoint is not None and checkpoint.task is not None:
        out["task"] = describe_task(checkpoint.task, config.n_embd)
    return out


def describe_task(record: dict[str, Any], n_embd: int) -> dict[str, Any]:
    """A fine-tuned checkpoint's task (its validated task.json): name, kind, classes, window,
    metrics, head size."""
    from gpt1.tasks.registry import get_task

    task = get_task(record["task"], record.get("spec") or None)
    out = {
        "task": record["task"],
        "kind": record["kind"],
        "labels": record.get("labels"),
        "n_outputs": record["n_outputs"],
        "n_ctx": record["n_ctx"],
        "metrics": list(task.metrics),
        "head_parameters": (n_embd + 1) * record["n_outputs"],
    }
    if task.f1_label is not None:
        out["f1_label"] = task.f1_label
    if (record.get("spec") or {}).get("columns"):
        out["columns"] = record["spec"]["columns"]
    return out


def _describe_lstm(checkpoint: CheckpointFolder, seq_len: int | None) -> dict[str, Any]:
    """The LSTM baseline (gpt1.model.lstm): counted on the meta device, nothing allocated."""
    import torch

    try:
        config = LSTMConfig.from_dict(
            checkpoint.config["model"], source=str(checkpoint.config_file)
        )
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    with torch.device("meta"):
        lstm = LSTMLM(config)
    T = seq_len or config.n_positions
    return {
        "source": str(checkpoint.folder),
        "arch": "lstm",
        "config": dataclasses.asdict(config),
        "parameters": lstm.num_parameters(),
        "parameters_without_embeddings": lstm.num_parameters(exclude_embeddings=True),
        "seq_len": T,
        "flops_per_token": model_flops(lstm, T),
    }


def describe_kernels() -> dict[str, Any]:
    """This CPU's instruction sets and, per product kind and for the decoding step, which
    implementation runs here and why (`gpt1.inference.backend.report`; builds nothing)."""
    from gpt1.inference import backend

    return {
        "isa": backend.isa(),
        "kernels": [dataclasses.asdict(choice) for choice in backend.report()],
    }


def build_kernels() -> tuple[Path, bool]:
    """Build (or find and check) the compiled kernel for this environment: (its folder, whether
    it was built now). Raises ConfigError where it is switched off or cannot be built."""
    from gpt1.inference import backend, kernel_build

    backend.check_environment()
    if backend.switch("GPT1_MATVEC") is False:
        raise ConfigError("GPT1_MATVEC switches gpt1's kernel off: nothing to build")
    fresh = not kernel_build.is_built()
    try:
        kernel_build.module()
    except Exception as e:  # the compiler's or the loader's own words, in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(
            f"the kernel could not be built in {kernel_build.build_folder()}: {first}"
        ) from None
    return kernel_build.build_folder(), fresh
