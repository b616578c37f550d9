"""CPU fast paths for the model: drop-ins for `F.dropout`, causal SDPA with dropout and
`F.linear`.

Each entry point is a drop-in for the torch function it names, falling back to it wherever the
fast path does not apply:

- `Dropout` / `dropout`: `nn.Dropout` / `F.dropout`. On CPU, for rates with a small exact fraction
  (0.1 = 1/10), masks come from `gpt1.model.masks.keep_mask` (drawn in bulk on every intra-op thread,
  several times cheaper than `bernoulli_`; dropout runs 19 times per step of the mini model).
- `causal_attention_cpu_train`: `F.scaled_dot_product_attention(q, k, v, dropout_p=p,
  is_causal=True)` on the CPU, which the attention seam (`gpt1.model.attention.attention`) calls
  there. With dropout, SDPA has no fused CPU kernel and falls back to a generic path slower than
  the four ops written out here (about 2x in bf16); this one also keeps less for backward.

- `prepack_for_inference(model)` (inference only, called by the commands that serve, predict,
  sample and score): every `nn.Linear` becomes a `PackedLinear` and the tied output layer gets a
  `PackedWeight`. Each keeps a copy of its weight reordered once into oneDNN's blocked layout
  and multiplies with oneDNN's inner-product kernel: on the CPUs measured, batch-1 decoding ran
  1.4-1.8x faster than with `F.linear` and classification up to 1.1x, except fp32 on a CPU with
  AMX, where `F.linear` decoded faster (`python benchmarks/inference.py --plain`; figures in
  docs/results.md). The copy costs one more weight's worth of memory,
  made lazily (the output layer's only if logits are asked for), and is remade whenever the
  weight changes. A few rows (decoding: up to `matvec.MAX_ROWS`) go to `gpt1.model.matvec`
  instead, which reads the plain weight at the memory's speed, where oneDNN's kernel reads it
  at about half.

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
from gpt1.model import backend, matvec
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


# ------------------------------------------------------------------ prepacked inference weights
# A packed weight works for any number of input rows; the hint only tunes oneDNN's layout choice
# (64 rows: measured as good as exact hints from 1 to 1500 rows on the block shapes).
_PACK_ROWS_HINT = 64


def prepack_available(dtype: torch.dtype) -> bool:
    """Whether many-row products with `dtype` weights use oneDNN's prepacked kernel here
    (`gpt1.model.backend.prepacks`: this torch and CPU can, and GPT1_PREPACK does not say off)."""
    return backend.prepacks(dtype)


class MadeFrom:
    """What a copy derived from a tensor (a packed layout, a quantised copy) was made from, and
    whether a tensor is still that: the same storage, dtype and shape, not written in place
    since (its version counter). Holding a view of the source keeps its storage alive, so a
    new tensor can never reuse the address and pass for it."""

    def __init__(self, source: torch.Tensor) -> None:
        self.source, self.version = source.detach(), _version_of(source)

    def matches(self, t: torch.Tensor) -> bool:
        src = self.source
        return (
            src.data_ptr() == t.data_ptr()
            and src.dtype == t.dtype
            and src.shape == t.shape
            and _version_of(t) == self.version
        )


class PackedWeight:
    """The oneDNN-packed copy of one weight matrix `[out, in]` and `linear(x, weight, bias)`
    with it: `F.linear`'s result (in fp32 up to summation order; bf16 gives the same bits).

    The copy is made on first use and remade whenever `weight` is not the tensor it was made
    from (`MadeFrom`: another storage, dtype or shape, as after `model.to(...)`, or changed in
    place). Anything the packed kernel does not cover (autograd, other devices or dtypes, mixed
    dtypes) goes to `F.linear`.
    """

    def __init__(self, rows_hint: int = _PACK_ROWS_HINT) -> None:
        self.rows_hint = rows_hint  # the number of rows (tokens) the layout is tuned for
        self._made: MadeFrom | None = None
        self._packed: torch.Tensor | None = None

    def __deepcopy__(self, memo: dict) -> PackedWeight:
        return PackedWeight(self.rows_hint)  # a copy packs its own (copied) weights when used

    def __reduce__(self):
        return (PackedWeight, (self.rows_hint,))  # pickles without the opaque oneDNN tensor

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if not self._applies(x, weight, bias):
            return F.linear(x, weight, bias)
        if matvec.applies(x, weight) and (op := backend.few_rows_kernel()) is not None:
            return matvec.linear(op, x, weight, None, bias)  # decoding: a few rows
        if self._made is None or not self._made.matches(weight):
            with torch.no_grad():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(
                    weight.detach(), self.rows_hint
                )
            self._made = MadeFrom(weight)
        # The kernel reads a strided (non-contiguous) 3-d bf16 input wrongly: always contiguous.
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self._packed, bias, "none", [], ""
        )

    @staticmethod
    def _applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        if torch.is_grad_enabled() and (
            x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return False  # the packed kernel has no backward
        return (
            x.device.type == "cpu"
            and weight.device.type == "cpu"
            and x.dtype == weight.dtype
            and (bias is None or bias.dtype == weight.dtype)
            and x.dim() >= 2
            and x.shape[-1] == weight.shape[1]
            and weight.dim() == 2
            and prepack_available(weight.dtype)
        )


def _version_of(t: torch.Tensor) -> int:
    """The in-place write counter (inference tensors keep none: they are only written under
    inference mode, by code that made them)."""
    return -1 if t.is_inference() else t._version


class PackedLinear(nn.Linear):
    """`nn.Linear` (the same parameters, names and state dict) whose inference forward uses a
    `PackedWeight`; training (autograd) goes through `F.linear` as before."""

    @classmethod
    def of(cls, linear: nn.Linear) -> PackedLinear:
        """A `PackedLinear` sharing `linear`'s weight and bias (nothing is copied)."""
        packed = cls(linear.in_features, linear.out_features, bias=False, device="meta")
        packed.weight, packed.bias = linear.weight, linear.bias
        packed.training = linear.training
        return packed

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._kernel = PackedWeight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._kernel.linear(x, self.weight, self.bias)


def prepack_for_inference(model: nn.Module) -> nn.Module:
    """Make `model` (in place; also returned) use packed weights on CPU: every plain
    `nn.Linear` becomes a `PackedLinear` and a model with a tied output layer (`lm_weight`)
    gets a `PackedWeight` for it (`GPT.lm_logits` uses it). Parameters, names and state dicts
    are unchanged, and gradients still flow through `F.linear`; on GPUs nothing changes.
    Set GPT1_PREPACK=0 to turn it off."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear.of(child))
    for module in model.modules():
        if callable(getattr(module, "lm_weight", None)):
            # The output layer runs mostly while decoding, one row at a time.
            module.lm_head_kernel = PackedWeight(rows_hint=1)
    return model
