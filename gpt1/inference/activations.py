"""GELU of bf16 activations by table lookup, for inference: torch's own bits, several times
faster.

A bf16 number has 65,536 bit patterns, so GELU (the tanh form GPT-1 uses) of bf16 activations is
a function on a finite set. `gelu_table()` holds torch's `F.gelu(x, approximate="tanh")` at every
one of them, computed once per process by torch itself; gpt1's compiled module then looks each
activation up (`kernels/table.cpp`: 16 lookups a gather, the 256 KB table in L2) instead of
widening it, evaluating tanh and narrowing again. The results are the bits torch's vectorised
kernel gives, by construction (`tests/test_activations.py` checks every pattern), wherever in a
tensor a number sits. Torch itself runs a tensor's last < 32 numbers through a scalar loop,
which differs from its vector loop at 4 bf16 inputs (-5.16 to -5.06, GELU below 2e-7, by at
most 1.6e-7) and in the payload of NaNs: there the table keeps the vector loop's answer.

On one core, 6-8x torch's GELU (9-13x under the AVX2 caps), and 1.2-1.3x a whole pass of many
rows through the int8 or bf16 model: `python benchmarks/many_rows.py`, figures in
docs/results.md. Elsewhere (fp32, a gradient wanted, another device, no compiled module)
`gelu` is torch's. An int8 model's fp32 activations (a CPU without bf16 instructions) take
`step_gelu`, the decoding step's own arithmetic, instead.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.inference import backend
from gpt1.model import gpt


@functools.cache
def gelu_table() -> torch.Tensor:
    """int32 `[65536]`: entry b holds, in its low 16 bits, the bits of torch's GELU (tanh form)
    of the bf16 number whose bits are b."""
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    with torch.no_grad():
        values = F.gelu(every, approximate="tanh")
    return values.view(torch.int16).to(torch.int32) & 0xFFFF


def gelu(x: torch.Tensor) -> torch.Tensor:
    """`gpt.gelu(x)`: by table for bf16 on the CPU where the compiled module is here and no
    gradient is wanted, else torch's."""
    if (
        x.dtype == torch.bfloat16
        and x.device.type == "cpu"
        and not (x.requires_grad and torch.is_grad_enabled())
    ):
        built = backend.kernel_module()
        if built is not None:
            return built.bf16_table(x.contiguous(), gelu_table())
    return gpt.gelu(x)


def step_gelu(x: torch.Tensor) -> torch.Tensor:
    """`gpt.gelu(x)` for the fp32 activations of an int8 model: as the compiled decoding step
    computes it (`kernels/step.cpp`: x / (1 + e^(-2u)), e^ by a polynomial; within 5e-7 of
    torch's, whose 1 + tanh(u) cancels where GELU nears 0), so the rows read outside the step
    (prompts, classification batches) take the step's GELU, in a third of torch's time on one
    core; torch's where the module is not here or a gradient is wanted."""
    if (
        x.dtype == torch.float32
        and x.device.type == "cpu"
        and not (x.requires_grad and torch.is_grad_enabled())
    ):
        built = backend.kernel_module()
        if built is not None and built.has_decode_step():
            return built.gelu_fp32(x)
    return gpt.gelu(x)


def look_up_gelu(model: nn.Module, how=gelu) -> None:
    """Every MLP of `model` whose activation is GELU takes `how` (`gelu` above, by table for
    bf16; `step_gelu` for an int8 model's fp32 activations) instead, in place."""
    for module in model.modules():
        if isinstance(module, gpt.MLP) and module.activation is gpt.gelu:
            module.activation = how
