"""Softmax kernels that overwrite their input, for large CPU tensors.

A fresh `[rows, cols]` result on CPU costs a page fault per 4 KiB on first touch, which for
attention probabilities and vocabulary-wide logits costs more than the softmax itself. torch's CPU
kernels read each row before writing it, so their `out=` may alias the input. Callers must own
the input (no autograd through it, no other reader of the old values).
"""

from __future__ import annotations

import torch


def softmax_(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax along `dim`, written into `x`; returns `x`."""
    return torch.ops.aten._softmax.out(x, dim, False, out=x)


def log_softmax_(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax along `dim`, written into `x`; returns `x`."""
    return torch.ops.aten._log_softmax.out(x, dim, False, out=x)


def softmax_backward_(grad: torch.Tensor, probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """d loss / d scores from d loss / d probs, written into `grad`; returns `grad`."""
    return torch.ops.aten._softmax_backward_data.out(grad, probs, dim, probs.dtype, grad_input=grad)
