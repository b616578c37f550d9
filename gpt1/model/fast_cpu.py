"""CPU fast paths for training the model: drop-ins for `F.dropout` and causal SDPA with dropout.

Each entry point is a drop-in for the torch function it names, falling back to it wherever the
fast path does not apply:

- `Dropout` / `dropout`: `nn.Dropout` / `F.dropout`. On CPU, for rates with a small exact fraction
  (0.1 = 1/10), masks come from `gpt1.model.masks.keep_mask` (drawn in bulk on every intra-op thread,
  several times cheaper than `bernoulli_`; dropout runs 19 times per step of the mini model).
- `causal_attention_cpu_train`: `F.scaled_dot_product_attention(q, k, v, dropout_p=p,
  is_causal=True)` on the CPU, which the attention function (`gpt1.model.attention.attention`) calls
  there. With dropout, SDPA has no fused CPU kernel and falls back to a generic path slower than
  the four ops written out here (about 2x in bf16); this one also keeps less for backward.

Inference's fast paths (prepacked weights, the compiled products, int8) are `gpt1.inference`.
Same distributions and the same maths as the plain path (`tests/test_model_fast_paths.py` and
`tests/test_attention_memory.py` check them against it); on GPUs everything goes to torch.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.inplace import softmax_, softmax_backward_
from gpt1.model.masks import keep_mask


def _rational_rate(p: float) -> tuple[int, int] | None:
    """(num, den) with num/den == p exactly (as floats) and den <= 255, else None."""
    frac = Fraction(p).limit_denominator(255)
    return (frac.numerator, frac.denominator) if float(frac) == p else None


class _MaskDropout(torch.autograd.Function):
    """Dropout with a `keep_mask` (drop rate exactly num/den)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, num: int, den: int) -> torch.Tensor:
        keep = keep_mask(x.shape, num, den, x.dtype)
        ctx.scale = den / (den - num)
        ctx.save_for_backward(keep)
        # A bool operand would be converted to a float copy first on CPU, about 3x slower.
        return x.mul(keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`F.dropout`, faster on CPU for rates with a small exact fraction (0.1 = 1/10)."""
    if not training or p == 0.0:
        return x
    rate = _rational_rate(p) if x.device.type == "cpu" else None
    if rate is None:  # GPUs have fused dropout kernels; odd rates keep torch's exact sampler
        return F.dropout(x, p, True)
    return _MaskDropout.apply(x, *rate)


class Dropout(nn.Dropout):
    """`nn.Dropout` using `dropout` above (same module type, same state)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def causal_attention_cpu_train(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float
) -> torch.Tensor:
    """Causal attention with dropout, written out: q, k, v `[B, H, T, D]` -> `[B, H, T, D]`.

    Same maths as SDPA: masked scores are -inf. Under bf16 autocast the softmax output is bf16
    (accumulated in fp32), as in transformers' eager attention; SDPA's generic path would upcast
    to fp32.
    """
    rate = _rational_rate(p) if p > 0 else None
    if rate is not None:
        return _CausalAttentionDropout.apply(q, k, v, *rate)
    return torch.matmul(dropout(_causal_probs(q, k), p, True), v)


def _causal_probs(q: torch.Tensor, k: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) + causal -inf mask): `[B, H, T, D]` x 2 -> `[B, H, T, T]`.

    The mask is always added in place (autograd does not need the scores); with `in_place`
    (no autograd through the result) the softmax overwrites them too (`gpt1.inplace`).
    """
    T = q.shape[-2]
    mask = torch.full((T, T), float("-inf"), device=q.device).triu_(1)  # [T, T]
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(1.0 / math.sqrt(q.shape[-1]))  # [B, H, T, T]
    scores.add_(mask.to(scores.dtype))
    return softmax_(scores) if in_place and scores.device.type == "cpu" else scores.softmax(-1)


# Above this many bytes of attention probabilities per layer, backward recomputes them from q and
# k (one more q k^T and softmax) instead of keeping them: the paper's model at 8 x 512 tokens
# holds 100 MB per layer in fp32, 1.2 GB in all; the mini model's 12 MB stay saved (faster).
RECOMPUTE_PROBS_BYTES = 32 << 20


class _CausalAttentionDropout(torch.autograd.Function):
    """dropout(softmax(q k^T / sqrt(D), causal)) @ v keeping at most the probabilities + keep-mask.

    Autograd would keep the probabilities and the dropped probabilities (two `[B, H, T, T]`
    tensors per layer) plus a bool mask; this keeps the 1-byte mask and, below
    `RECOMPUTE_PROBS_BYTES`, the probabilities. Same mask draws as `dropout`. Under autocast the
    inputs are cast once here, so a recomputation in backward repeats the forward exactly.
    """

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num: int, den: int
    ) -> torch.Tensor:
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        if torch.is_autocast_enabled(q.device.type):
            dt = torch.get_autocast_dtype(q.device.type)
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
        with torch.autocast(q.device.type, enabled=False):
            probs = _causal_probs(q, k, in_place=True)  # [B, H, T, T]
            ctx.scale = den / (den - num)
            ctx.recompute = probs.numel() * probs.element_size() > RECOMPUTE_PROBS_BYTES
            # Large (recomputed) layers keep a 1-byte mask; small ones one in the probabilities'
            # 16-bit dtype, which multiplies faster (see keep_mask).
            mask_dtype = torch.uint8 if ctx.recompute else probs.dtype
            keep = keep_mask(probs.shape, num, den, mask_dtype)  # [B, H, T, T]
            ctx.save_for_backward(q, k, v, keep, None if ctx.recompute else probs)
            # The 1 / (1 - p) scale goes on the 4x smaller [B, H, T, D] side; unsaved
            # probabilities are dropped in place (no fresh [B, H, T, T] buffer).
            dropped = probs.mul_(keep) if ctx.recompute else probs.mul(keep)
            return torch.matmul(dropped, v).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k, v, keep, probs = ctx.saved_tensors
        if probs is None:
            probs = _causal_probs(q, k, in_place=True)
        grad = grad.to(v.dtype).mul(ctx.scale)  # [B, H, T, D]
        grad_probs = torch.matmul(grad, v.transpose(-1, -2)).mul_(keep)  # [B, H, T, T]
        # In place, reusing the [B, H, T, T] buffers (fresh ones page-fault on CPU): backward runs
        # once, so the saved probabilities may be overwritten once their last reader is done.
        grad_scores = softmax_backward_(grad_probs, probs)
        grad_v = torch.matmul(probs.mul_(keep).transpose(-1, -2), grad)  # [B, H, T, D]
        grad_scores.mul_(1.0 / math.sqrt(q.shape[-1]))
        grad_q = torch.matmul(grad_scores, k)  # [B, H, T, D]
        grad_k = torch.matmul(grad_scores.transpose(-1, -2), q)  # [B, H, T, D]
        dq, dk, dv = ctx.dtypes
        return grad_q.to(dq), grad_k.to(dk), grad_v.to(dv), None, None
