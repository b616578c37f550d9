"""int8 for CPU inference: every linear layer and the tied output layer.

Batch-1 decoding reads every weight once per token, so on a CPU its speed is set by memory
bandwidth: int8 weights are a quarter of fp32's bytes and half of bf16's. Each weight matrix
`[out, in]` is stored as int8 with one scale per output channel (symmetric, round to nearest
even, the scale chosen so the row's largest magnitude maps to 127), made at load time from the
fp32 checkpoint and deterministic. Activations are in a float type (bf16 where the CPU has bf16
instructions, else fp32) between the products, and every product returns that type.

For a few rows (decoding) only the weights are rounded: the kernel is gpt1's own
(`gpt1.inference.matvec`: C++ built on first use by `kernel_build`, reading each int8 weight once for up to 8 rows
and multiplying it by the float activations in fp32), or torch's fused
`aten._weight_int8pack_mm` where ours cannot be built; neither makes a dequantised copy of a
weight, so a product reads one byte per weight.

For many rows (a classification batch, a prompt, perplexity's logits) the multiplications are
the cost, and the product is int8 x int8 on oneDNN's kernel (`PackedInt8`; AMX or VNNI
instructions where the CPU has them): the activations are quantised to int8 on each call with
one scale for the whole tensor (symmetric, the largest magnitude to 127, as ONNX Runtime's
dynamic quantisation does; in two passes of gpt1's compiled module, `kernels/quantize.cpp`,
where it is built), the weight is a copy of the int8 matrix in oneDNN's layout made on
first use (remade if the weight changes; not pickled or deep-copied), and the kernel sums in
int32 and applies both scales and the bias before writing the float output. One scale per
tensor rather than per row: on GPT-1's layers it was faster (per-row scales cost another pass
over the output) and no less accurate on the model measured (docs/results.md, "int8
inference"); a row's result depends on the largest activation in its batch, so the same
sentence can score a little differently in another batch. The activations go to oneDNN as
signed bytes, or as unsigned bytes with zero point 128 (the same integers), whichever this CPU
has a real kernel for: `gpt1.inference.backend` times both against the float path once per process
(oneDNN's reference kernel, which it falls back to for signed bytes on CPUs with VNNI but no
AMX, is about a thousand times slower). Where that kernel does not apply or is slower (autograd,
a non-finite activation, a torch build without it, after it failed once, with a warning;
`GPT1_INT8_MATMUL=0` switches it off), many rows take one float matrix product over the int8
values (exact in bf16) with the scales applied to its output: the same numbers up to the
activations' rounding. Where oneDNN's kernel sums inexactly (no VNNI or AMX: its 16-bit pair
sums saturate; `backend.onednn_int8_exact`), and for up to `backend.own_int8_rows` rows of the
decoding step, gpt1's own kernel multiplies instead (`kernels/int8_rows.cpp`: exact sums, one
scale per row; without VNNI each row as 7-bit numbers with a zero point, `int8_rows.FORMS`).

`quantize_int8_(model)` refuses, with one line, where quality cannot be kept: a layer with a row
whose int8 weights differ from the float ones by more than `MAX_RELATIVE_ERROR` of that row
(a few outlier weights in a row stretch its scale, and its other weights lose most of their
precision).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.errors import ConfigError
from gpt1.inference import backend, int8_rows, matvec
from gpt1.inference.prepack import MadeFrom

# The rounding error (`relative_error`, the worst row of a layer) above which a layer is refused.
# Measured on random [2304, 768] matrices: Gaussian rows 1.2%, Laplace 2.5%, Student-t with 4
# degrees of freedom (far heavier tails than trained GPT weights) 16%; a row whose few large
# weights leave the rest only a couple of levels is near 100%. 20% refuses only the broken.
MAX_RELATIVE_ERROR = 0.20
_KERNEL_BLOCK = 16


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` `[N, K]` -> (int8 `[N, K]`, fp32 scales `[N]`) with weight ~= q * scale[:, None]."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))  # an all-zero row stays 0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def relative_error(weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> float:
    """The worst row's rounding error relative to that row's size without its largest weight:
    max over rows of ||w - q * scale|| / ||w minus its largest |w| ||. A row's largest weight
    sets its scale (and is kept nearly exactly), so measuring against the rest shows what an
    outlier does to them: a Gaussian row of 768 gives about 1.2%, a row whose other weights
    all round to zero 100%."""
    w = weight.detach().float()
    err = (w - q.float() * scale[:, None]).norm(dim=1)  # [N]
    largest = w.abs().argmax(dim=1, keepdim=True)  # [N, 1]
    rest = w.scatter(1, largest, 0.0).norm(dim=1)  # [N] (not a difference of squares: 500^2
    # + 0.02^2 - 500^2 is lost to rounding in fp32)
    ratio = torch.where(rest > 0, err / rest.clamp_min(1e-30), torch.zeros_like(err))
    return float(ratio.max()) if ratio.numel() else 0.0


_INT8PACK_DTYPES = (torch.bfloat16, torch.float32, torch.float16)  # torch's fallback kernel takes


def int8_linear(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    packed: PackedInt8 | None = None,
) -> torch.Tensor:
    """`F.linear(x, q * scale[:, None], bias)` for x `[..., K]`, q int8 `[N, K]`, scale `[N]`
    fp32: a kernel that reads each weight once for a few rows (decoding); for many rows, with a
    `packed` copy of q, an int8 x int8 matrix product of x quantised per tensor; else the same
    maths as a float matrix product with the scales applied to its output.

    The few-row kernels win where reading the weights is the cost and lose on many rows (a
    classification batch, a prompt), where the work is the multiplications. Which inputs are "a
    few rows" is `matvec.applies`, the rule the float weights' products follow too. The few-row
    kernel is gpt1's own (`gpt1.inference.matvec`), or torch's `_weight_int8pack_mm` where ours
    cannot be built (that one reads the weights once per row and needs K to be a multiple of
    16). The many-row int8 product is `PackedInt8.linear`; where it does not apply (autograd,
    no oneDNN int8 kernel) one float matrix product over the int8 values (exact in bf16) does
    the work."""
    if matvec.applies(x, q) and not int8_rows.asked():  # the integer step asks for rows
        op = backend.few_rows_kernel()
        if op is not None:
            return matvec.linear(op, x, q, scale, bias)
        if q.shape[1] % _KERNEL_BLOCK == 0 and x.dtype in _INT8PACK_DTYPES:
            return matvec.linear(_int8pack, x, q, scale, bias)
    elif packed is not None:
        out = packed.linear(x, q, scale, bias)
        if out is not None:
            return out
    return _dequantised_linear(x, q, scale, bias)


def _int8pack(
    rows: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """torch's fused int8-weight kernel, called as `backend.few_rows_kernel()`'s result is."""
    out = torch.ops.aten._weight_int8pack_mm(rows.contiguous(), q, scale.to(rows.dtype))
    return out if bias is None else out.add_(bias)


def _dequantised_linear(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    out = F.linear(x, q.to(x.dtype)) * scale.to(x.dtype)  # int8 values are exact in bf16
    return out if bias is None else out + bias


_NONE = torch.empty(0, dtype=torch.uint8)  # "no few-row copy" in the step's tensor list
# Activations the many-row int8 product takes (its output comes back in the same dtype).
_PACKED_INT8_DTYPES = (torch.bfloat16, torch.float32)


class PackedInt8:
    """oneDNN's packed copy of one int8 weight `[N, K]` and, with it, `linear(x, q, scale,
    bias)` for many rows: x is quantised to int8 with one scale for the whole tensor (symmetric,
    its largest magnitude to 127, as ONNX Runtime's dynamic quantisation does), multiplied by
    the int8 weight with int32 sums on the CPU's int8 instructions (AMX or VNNI where it has
    them), and the two scales and the bias are applied inside the kernel, which writes x's dtype.

    The copy is made on first use and remade whenever `q` is not the tensor it was made from
    (`prepack.MadeFrom`: another storage, dtype or shape, or changed in place). `linear` returns None where it does not
    apply (autograd, another device or dtype, a non-finite x, no oneDNN int8 kernel, or the
    kernel failed once: then it is not tried again in this process); the caller then takes the
    float path, which gives the same numbers up to the activations' rounding."""

    def __init__(self) -> None:
        # One attribute: threads that pack at once never pair one's weight with the other's
        # zero points or stamp.
        self._copy: tuple[torch.Tensor, torch.Tensor, MadeFrom] | None = None
        self._few_rows: tuple[torch.Tensor, MadeFrom] | None = None

    def __deepcopy__(self, memo: dict) -> PackedInt8:
        return PackedInt8()  # a copy packs its own (copied) weight when used

    def __reduce__(self):
        return (PackedInt8, ())  # pickles without the opaque oneDNN tensor

    def linear(
        self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        if not _packed_int8_applies(x, q, bias):
            return None
        encoding = backend.int8_many_rows()
        rows = x.reshape(-1, x.shape[-1])
        # gpt1's kernel takes a few rows of the decoding step, and every product where oneDNN's
        # int8 kernel saturates. There it beats the float path at every row count measured
        # (`python benchmarks/int8_arithmetic.py --tier avx2`, one thread, 2026-12-06): 768 ->
        # 3072 at 64 rows 2.6 ms against 4.7 as an fp32 product and 23 as a bf16 one, at 2048
        # rows 91 against 139 ms; 768 -> 40478 at 64 rows 35 against 117 ms (fp32).
        own = backend.own_int8_rows(q.shape[1])  # 0 where gpt1's kernel is not built
        if own and (
            (int8_rows.asked() and rows.shape[0] <= own) or backend.onednn_int8_saturates()
        ):
            return self._own_kernel(x, rows, q, scale, bias)
        if encoding is None:
            return None
        per_row = int8_rows.asked() or backend.int8_per_row()
        kernels = backend.int8_row_kernels() if per_row else None
        found = int8_rows.quantize(rows, kernels) if per_row else _quantize_per_tensor(rows)
        if found is None or found[0] is None:
            return None
        qx, x_scale = found
        try:
            if per_row:
                sums = self.product(qx, 1.0, q, scale, None, torch.float32, encoding)
                out = int8_rows.epilogue(sums, x_scale, bias, x.dtype, kernels)
            else:
                out = self.product(qx, x_scale, q, scale, bias, x.dtype, encoding)
        except RuntimeError as e:
            backend.fail(
                "many rows int8",
                "oneDNN's int8 matrix product failed",
                e,
                "int8 products of many rows use the float path (GPT1_INT8_MATMUL=0 silences this)",
            )
            return None
        return out.view(*x.shape[:-1], q.shape[0])

    def _own_kernel(
        self,
        x: torch.Tensor,
        rows: torch.Tensor,
        q: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """gpt1's int8 kernel (`kernels/int8_rows.cpp`: one scale per row, exact sums, the
        weights fetched ahead), for a few rows of the decoding step's and wherever oneDNN's
        kernel is missing or inexact; None for a row holding an inf or a NaN (the float path)."""
        if q.shape[1] % 4:
            return None
        out = backend.kernel_module().rows_product(
            rows, self.few_rows(q), scale.float(), bias, q.shape[0]
        )
        return None if out is None else out.view(*x.shape[:-1], q.shape[0])

    def product(
        self,
        qx: torch.Tensor,
        x_scale: float,
        q: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        encoding: str,
    ) -> torch.Tensor:
        """oneDNN's int8 product of activations `qx` (int8, one `x_scale`) and `q`, in `dtype`,
        the activations handed over as `encoding` says (`backend.onednn_int8_product`)."""
        packed = self.packed(q)
        return backend.onednn_int8_product(qx, x_scale, packed, scale, bias, dtype, encoding)

    def packed(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """oneDNN's packed copy of `q` and its zero points (all 0: symmetric), made or remade
        here where `q` is not what the copy was made from."""
        copy = self._copy
        if copy is None or not copy[2].matches(q):
            copy = (*backend.pack_int8(q), MadeFrom(q))
            self._copy = copy
        return copy[0], copy[1]

    def few_rows(self, q: torch.Tensor) -> torch.Tensor:
        """`q` in the layout of gpt1's int8 kernel (`kernels/int8_rows.cpp`: VNNI, AMX tiles or
        AVX2), made or remade here as `packed` is; empty where that kernel is not compiled for
        this CPU."""
        copy = self._few_rows
        if copy is None or not copy[1].matches(q):
            built = backend.kernel_module()
            made = built.pack_vnni(q) if built is not None and q.shape[1] % 4 == 0 else None
            copy = (_NONE if made is None else made, MadeFrom(q))
            self._few_rows = copy
        return copy[0]


def _packed_int8_applies(x: torch.Tensor, q: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if torch.is_grad_enabled() and (x.requires_grad or (bias is not None and bias.requires_grad)):
        return False  # the int8 kernel has no backward
    return (
        x.is_cpu
        and q.is_cpu
        and x.dtype in _PACKED_INT8_DTYPES
        and (bias is None or bias.dtype == x.dtype)
        and x.dim() >= 2
        and x.numel() > 0
        and x.shape[-1] == q.shape[1]
    )


def _quantize_per_tensor(rows: torch.Tensor) -> tuple[torch.Tensor | None, float]:
    """rows `[M, K]` -> (int8 `[M, K]`, scale) with rows ~= int8 * scale, or (None, 0.0) where
    rows hold no finite non-zero magnitude to scale by. Two passes in gpt1's compiled module
    where it is built for this CPU (scaled in fp32), else four torch operators (scaled in the
    rows' dtype): the same integers up to that rounding."""
    built = backend.kernel_module()
    if built is not None and built.has_quantize_per_tensor():
        qx, x_scale = built.quantize_per_tensor(rows.contiguous())
        return (qx, x_scale) if qx is not None else (None, 0.0)
    lo, hi = torch.aminmax(rows)
    amax = max(-float(lo), float(hi))
    if not 0.0 < amax < math.inf:  # all zeros, an inf or a NaN: the float path keeps them
        return None, 0.0
    # |x| * (127 / amax) <= 127 up to one fp32 rounding, which rounds back to 127: no clamp.
    # Contiguous: the product keeps a strided input's layout, and oneDNN takes dense rows.
    qx = (
        torch.mul(rows, 127.0 / amax).round_().to(torch.int8, memory_format=torch.contiguous_format)
    )
    return qx, amax / 127.0


class Int8Linear(nn.Module):
    """An `nn.Linear` for inference with int8 weights (buffers `qweight` `[out, in]` int8 and
    `scale` `[out]`) and the float bias; the float weight is not kept."""

    def __init__(self, linear: nn.Linear, act_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_rows(linear.weight)
        self.register_buffer("qweight", q.to(linear.weight.device))
        self.register_buffer("scale", scale.to(linear.weight.device))  # fp32, like the kernel
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(act_dtype), False)
        self.error = relative_error(linear.weight, q, scale)
        self._packed = PackedInt8()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.qweight, self.scale, self.bias, self._packed)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int8Head:
    """The tied output layer in int8 (`GPT.lm_logits` calls `linear(hidden, weight, None)`): a
    quantised copy of the token table, remade if the table is replaced or written in place."""

    def __init__(self, weight: torch.Tensor):
        self._packed = PackedInt8()
        self._quantize(weight)

    def _quantize(self, weight: torch.Tensor) -> None:
        self.q, scale = quantize_rows(weight)
        self.error = relative_error(weight, self.q, scale)
        self.scale = scale
        self._made = MadeFrom(weight)

    def table_moved(self, weight: torch.Tensor) -> None:
        """The token table now lives in `weight`, its values unchanged (`arena.gather` moved
        it): the int8 copy is kept and stamped with the table's new place."""
        self._made = MadeFrom(weight)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if not self._made.matches(weight):
            self._quantize(weight)
        return int8_linear(x, self.q, self.scale, bias, self._packed)


def quantize_int8_(model: nn.Module, act_dtype: torch.dtype) -> nn.Module:
    """Quantise `model` in place (also returned) for inference: every `nn.Linear` (and subclass,
    such as prepack's `PackedLinear`) becomes an `Int8Linear`, and a model with a tied output
    layer (`lm_weight`) gets an `Int8Head` as its `lm_head_kernel`. The model must already be on
    the CPU in `act_dtype`. Raises ConfigError, changing nothing, where a layer would lose too
    much (see `MAX_RELATIVE_ERROR`)."""
    swaps = []
    for parent_name, parent in model.named_modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                qualified = f"{parent_name}.{name}" if parent_name else name
                swaps.append((qualified, parent, name, Int8Linear(child, act_dtype)))
    heads = [
        (name or "model", module, Int8Head(module.lm_weight()))
        for name, module in model.named_modules()
        if callable(getattr(module, "lm_weight", None))
    ]
    errors = [(n, lin.error) for n, _, _, lin in swaps] + [
        (n + ".lm_head", h.error) for n, _, h in heads
    ]
    worst = max(errors, key=lambda e: e[1], default=("", 0.0))
    if worst[1] > MAX_RELATIVE_ERROR:
        raise ConfigError(
            f"--precision int8: layer {worst[0]} would change by {worst[1]:.1%} in int8 "
            f"(more than {MAX_RELATIVE_ERROR:.0%}: a few large weights stretch its scale); "
            "use bf16 or fp32 for this checkpoint"
        )
    for _, parent, name, lin in swaps:
        setattr(parent, name, lin)
    for _, module, head in heads:
        module.lm_head_kernel = head
    return model


def quantized_layers(model: nn.Module) -> int:
    """How many `Int8Linear` layers `model` holds (0: not quantised)."""
    return sum(isinstance(m, Int8Linear) for m in model.modules())
