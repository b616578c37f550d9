"""Memory a model needs, estimated from its config alone, and a refusal when it cannot fit.

Every command that builds a model from sizes read from a file or flag asks `ensure_fits` first,
so a config describing a model larger than the device is refused in milliseconds, naming the
fields and the estimate, instead of allocating until the machine swaps or the kernel kills it.
The estimates are lower bounds (weights, and for training gradients, the two Adam moments and a
floor on activations): what they refuse cannot run; what they pass may still be tight.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from gpt1.config import ModelConfig, TrainConfig
from gpt1.errors import ConfigError
from gpt1.model.gpt import parameter_count as count
from gpt1.model.lstm import LSTMConfig, lstm_parameter_count

FLOAT_BYTES = 4  # weights, gradients and optimizer moments are kept in float32


class TooLargeError(ConfigError):
    """A config whose estimated memory exceeds what the device has."""


def parameter_count(config: ModelConfig, extra: int = 0) -> int:
    """Parameters of a GPT with `config` (plus `extra`, e.g. a task head), without allocating."""
    return count(config) + int(extra)


def inference_bytes(config: ModelConfig, extra_params: int = 0) -> int:
    """Float32 weights of the model: the floor for loading it anywhere."""
    return parameter_count(config, extra_params) * FLOAT_BYTES


def training_bytes(
    config: ModelConfig, train: TrainConfig, n_ctx: int, extra_params: int = 0, world_size: int = 1
) -> int:
    """A floor on one process's training memory.

    Weights + gradients + two Adam moments (16 bytes a parameter; FSDP shards them over
    `world_size`), one chunk of LM logits, and the residual stream of every layer for a
    micro-batch (one [B, T, C] float32 tensor a layer; with gradient checkpointing only that is
    kept, without it a transformer keeps several times more, so this never over-counts).
    """
    params = parameter_count(config, extra_params)
    state = params * FLOAT_BYTES * 4
    if train.distributed == "fsdp" and world_size > 1:
        state //= world_size
    tokens = train.micro_batch_size * n_ctx
    logits = min(tokens, max(train.loss_chunk_tokens, 1)) * config.vocab_size * FLOAT_BYTES
    activations = tokens * config.n_embd * config.n_layer * FLOAT_BYTES
    return state + logits + activations


def available_bytes(device: str | torch.device = "cpu") -> tuple[int, str]:
    """(bytes usable on `device`, a description): CUDA's total memory, or the RAM available now."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return int(props.total_memory), f"cuda:{index} ({props.name}) has"
    return _cpu_available(), "this machine has"


def _cpu_available() -> int:
    """MemAvailable from /proc/meminfo (capped by a cgroup limit), else physical memory."""
    found = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if found is None:
        try:
            found = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return 1 << 62  # unknown platform: do not refuse on a guess
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            found = min(found, int(raw))
    return found


def human(n: int) -> str:
    """Bytes as a short decimal figure (1.5 GB)."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if value < 1000 or unit == "PB":
            return f"{value:,.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1000
    return f"{n} B"


def shape_fields(config: ModelConfig) -> str:
    """The config fields that decide the size, as `name=value` pairs."""
    return ", ".join(
        f"{k}={getattr(config, k):,}"
        for k in ("n_layer", "n_embd", "n_inner", "vocab_size", "n_positions")
    )


def ensure_fits(
    need: int, what: str, source: str, fields: str, device: str | torch.device = "cpu"
) -> None:
    """Refuse (`TooLargeError`) when `need` bytes exceed what `device` has."""
    have, where = available_bytes(device)
    if need > have:
        raise TooLargeError(
            f"{source}: {what} needs at least {human(need)} ({fields}) but "
            f"{where} {human(have)}; lower these sizes"
        )


def ensure_model_fits(
    config: ModelConfig, source: str, device: str | torch.device = "cpu", extra_params: int = 0
) -> None:
    """Refuse a GPT whose float32 weights cannot fit in RAM (where loading happens) or on
    `device`."""
    params = parameter_count(config, extra_params)
    ensure_weights_fit(params, f"{params:,} parameters from {shape_fields(config)}", source, device)


def ensure_lstm_fits(
    config: LSTMConfig, source: str, device: str | torch.device = "cpu", extra_params: int = 0
) -> None:
    """`ensure_model_fits` for the LSTM baseline."""
    params = lstm_parameter_count(config) + extra_params
    ensure_weights_fit(params, f"{params:,} parameters", source, device)


def ensure_weights_fit(params: int, fields: str, source: str, device: str | torch.device) -> None:
    """Refuse `params` float32 weights that cannot fit in RAM or on a CUDA `device`."""
    for where in ("cpu", device) if torch.device(device).type == "cuda" else ("cpu",):
        ensure_fits(params * FLOAT_BYTES, "the model", source, fields, where)


def ensure_training_fits(
    config: ModelConfig,
    train: TrainConfig,
    n_ctx: int,
    source: str,
    device: str | torch.device = "cpu",
    extra_params: int = 0,
    world_size: int = 1,
) -> None:
    """Refuse a training run whose weights, gradients, Adam moments and activations cannot fit."""
    need = training_bytes(config, train, n_ctx, extra_params, world_size)
    fields = (
        f"{parameter_count(config, extra_params):,} parameters from {shape_fields(config)}; "
        f"micro_batch_size={train.micro_batch_size}, n_ctx={n_ctx}"
    )
    ensure_fits(need, "training", source, fields, device)
