"""The weight products of decoding (`kernels/matvec.cpp`): a few rows times a weight matrix,
reading the weights at the memory's speed; built on first use.

Batch-1 decoding multiplies one row by every weight matrix, so its speed is the speed of reading
the weights. oneDNN's products (fp32, bf16) and torch's int8-weight kernel
(`aten._weight_int8pack_mm`) read them at about half the bandwidth a plain read of the same bytes
reaches (`python benchmarks/decode.py`; docs/results.md). This kernel reads each weight once for
up to `MAX_ROWS` rows (int8 with per-channel scales, bf16 or fp32), widens it to fp32 in
registers, multiplies it by the activations in fp32 and fetches the weights ahead of the
multiply; it runs on torch's own threads (`at::parallel_for`). Its results equal `F.linear`'s up
to the order of summation.

It is part of gpt1's compiled module (`gpt1.inference.kernel_build`); `gpt1.inference.backend`
decides whether it runs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MAX_ROWS = 8  # the most rows one call takes (its accumulators live in registers)
DTYPES = (torch.int8, torch.bfloat16, torch.float32)  # the weight types it reads


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `kernel()` takes `F.linear(x, weight)` (`x` `[..., K]`): few rows, CPU, no
    autograd. Reads attributes only: decoding asks 49 times a token."""
    return (
        x.is_cpu
        and weight.is_cpu
        and x.numel() <= MAX_ROWS * x.shape[-1]
        and x.numel() > 0
        and weight.dtype in DTYPES
        and x.dtype.is_floating_point
        and weight.is_contiguous()
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )


def linear(
    op: Callable[..., torch.Tensor],
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`op` (the kernel) on `x` `[..., K]` of any rank: `[..., N]`."""
    if x.dim() == 2:
        return op(x, weight, scale, bias)
    out = op(x.reshape(-1, x.shape[-1]), weight, scale, bias)
    return out.view(*x.shape[:-1], weight.shape[0])
