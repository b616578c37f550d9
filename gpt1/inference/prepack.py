"""Prepacked weights for inference on CPU: `prepack_for_inference(model)`.

Called by `gpt1.inference.prepared.for_inference` (the commands that serve, predict, sample and
score): every `nn.Linear` becomes a `PackedLinear` and the tied output layer gets a
`PackedWeight`. Each keeps a copy of its weight reordered once into oneDNN's blocked layout and
multiplies with oneDNN's inner-product kernel: on the CPUs measured, batch-1 decoding ran 1.4-1.8x
faster than with `F.linear` and classification up to 1.1x, except fp32 on a CPU with AMX, where
`F.linear` decoded faster (`python benchmarks/inference.py --plain`; figures in docs/results.md).
The copy costs one more weight's worth of memory, made lazily (the output layer's only if logits
are asked for), and is remade whenever the weight changes (`MadeFrom`). A few rows (decoding: up
to `matvec.MAX_ROWS`) go to `gpt1.inference.matvec` instead, which reads the plain weight at the
memory's speed, where oneDNN's kernel reads it at about half. Whether each product kind takes
these kernels is decided in one place, `gpt1.inference.backend`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.inference import backend, matvec

# A packed weight works for any number of input rows; the hint only tunes oneDNN's layout choice
# (64 rows: measured as good as exact hints from 1 to 1500 rows on the block shapes).
_PACK_ROWS_HINT = 64


def prepack_available(dtype: torch.dtype) -> bool:
    """Whether many-row products with `dtype` weights use oneDNN's prepacked kernel here
    (`gpt1.inference.backend.prepacks`: this torch and CPU can, and GPT1_PREPACK does not say off)."""
    return backend.prepacks(dtype)


class MadeFrom:
    """What a copy derived from a tensor (a packed layout, a quantised copy) was made from, and
    whether a tensor is still that: the same storage, dtype and shape, not written in place
    since (its version counter). Holding a view of the source keeps its storage alive, so a
    new tensor can never reuse the address and pass for it."""

    def __init__(self, source: torch.Tensor) -> None:
        self.source, self.version = source.detach(), version_of(source)

    def matches(self, t: torch.Tensor) -> bool:
        src = self.source
        return (
            src.data_ptr() == t.data_ptr()
            and src.dtype == t.dtype
            and src.shape == t.shape
            and version_of(t) == self.version
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
        few_rows = matvec.applies(x, weight)
        if few_rows and (op := backend.few_rows_kernel()) is not None:
            return matvec.linear(op, x, weight, None, bias)  # decoding: a few rows
        if not backend.packed_is_faster(weight.dtype, few_rows):
            return F.linear(x, weight, bias)  # faster than oneDNN's packed product on this CPU
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


def version_of(t: torch.Tensor) -> int:
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
