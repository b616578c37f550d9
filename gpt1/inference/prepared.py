"""Making a loaded model ready for inference, the same way for every command that runs one.

`for_inference(model, device, precision)` places and casts the model, switches it to eval,
quantises it for `--precision int8` (`gpt1.inference.quantize`), prepacks the CPU weights
(`gpt1.inference.prepack.prepack_for_inference`), marks the model's weights to be gathered into
one storage when it first decodes (`gpt1.inference.arena`), lets bf16 activations on the CPU look
GELU up (`gpt1.inference.activations`: torch's bits) and plans the one-call decoding step
(`gpt1.inference.block_step.prepare`); which kernels run is `gpt1.inference.backend`'s decision. serve, sample, evaluate, predict, zeroshot and
lm-eval all call it, so a precision means the same thing in each.

Precisions (`gpt1.devices`): fp32, bf16 and fp16 cast weights and activations; `int8` stores
every linear layer's weight and the tied output layer in int8 with per-channel scales and runs
the activations in bf16 where the CPU has bf16 instructions (fp32 elsewhere); products of many
rows quantise the activations to int8 as well (one scale per tensor). int8 is a CPU
precision: on a GPU it is refused with one line, as it is for the LSTM baseline (no linear
layers to speak of) and for weights it would damage (`gpt1.inference.quantize`).
"""

from __future__ import annotations

import torch
from torch import nn

from gpt1.devices import resolve_device, resolve_precision, torch_dtype
from gpt1.errors import ConfigError
from gpt1.inference import activations, arena, backend, block_step
from gpt1.inference.backend import cpu_has_bf16
from gpt1.inference.prepack import prepack_for_inference
from gpt1.inference.quantize import quantize_int8_


def activation_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype a resolved precision runs its activations (and unquantised weights) in."""
    if precision != "int8":
        return torch_dtype(precision)
    if device.type != "cpu":
        raise ConfigError(
            f"--precision int8 runs on the CPU only (asked for {device}); use bf16 on a GPU"
        )
    return torch.bfloat16 if cpu_has_bf16() else torch.float32


def for_inference(
    model: nn.Module, device: str | torch.device = "auto", precision: str = "auto"
) -> nn.Module:
    """`model` on `device` in `precision` (names as `gpt1.devices` resolves them), in eval mode,
    quantised for int8 and prepacked for the CPU. Returns the model (changed in place)."""
    backend.check_environment()  # a misspelt GPT1_* switch is refused before any work
    where = resolve_device(device) if not isinstance(device, torch.device) else device
    resolved = resolve_precision(precision, where)
    if resolved == "int8" and not any(isinstance(m, nn.Linear) for m in model.modules()):
        raise ConfigError(
            f"--precision int8 needs a Transformer (linear layers); {type(model).__name__} "
            "has none to quantise: use fp32 or bf16"
        )
    model = model.to(device=where, dtype=activation_dtype(resolved, where)).eval()
    model = prepack_for_inference(model)
    if resolved == "int8":
        quantize_int8_(model, activation_dtype(resolved, where))
    if where.type == "cpu" and activation_dtype(resolved, where) == torch.bfloat16:
        activations.look_up_gelu(model)  # torch's bits, by table
    elif where.type == "cpu" and resolved == "int8":
        activations.look_up_gelu(model, activations.step_gelu)  # the decoding step's GELU
    if where.type == "cpu" and backend.gathers_weights():
        arena.gather_when_decoding(model)  # one storage on huge pages, if it ever decodes
    block_step.prepare(model)  # the decoding step's plan (builds nothing)
    return model
