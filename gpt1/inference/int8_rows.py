"""int8 x int8 products of many rows with one activation scale per row.

Each row of the activations is quantised on its own, multiplied by the int8 weight with exact
int32 sums (oneDNN's int8 kernel with AMX or VNNI, or gpt1's own, `kernels/int8_rows.cpp`, for a
few rows and wherever oneDNN's sums saturate), which are converted to fp32 and multiplied by the
weight's per-channel scales; the row scales and the bias are applied after (oneDNN takes one
activation scale per call, so a row's cannot go into its kernel). A row is quantised in one of
two forms (`FORMS`):

* "s8", with VNNI, AMX and oneDNN: symmetric, its largest magnitude to 127, rounded to nearest
  even (`quantize`);
* "u7", gpt1's AVX2 kernel: its range [min(x, 0), max(x, 0)] in 127 steps with a zero point
  (`quantize_u7`), since without VNNI signed 8-bit activations cost the kernel a third more
  arithmetic to keep the sums exact. A row whose values share one sign keeps s8's step; one
  spanning [-a, a] rounds in steps twice as coarse.

Then:

    out[m, n] = fp32(sum_k qx[m, k] * q[n, k]) * w_scale[n] * x_scale[m] + bias[n]

in fp32, then rounded to the activations' dtype (`reference` writes this out in plain torch;
the kernel gives the same bits). A row's result so depends on that row alone, never on which
rows share the product: a sequence decoded beside others gets the tokens it gets alone. The
per-tensor product (`quantize.PackedInt8`'s other mode) scales every row by the batch's
largest activation, so a row with small activations loses precision beside a large one.

`per_row()` asks for per-row scales in the products run inside it (concurrent decoding, where
the rows are independent sequences); elsewhere the many-row int8 products take per-row scales
where `gpt1.inference.backend`'s timed check found them not slower than one scale per tensor.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

_PER_ROW = contextvars.ContextVar("gpt1_int8_per_row", default=False)


@contextlib.contextmanager
def per_row(wanted: bool = True) -> Iterator[None]:
    """Many-row int8 products inside take one activation scale per row (where `wanted`)."""
    token = _PER_ROW.set(wanted or _PER_ROW.get())
    try:
        yield
    finally:
        _PER_ROW.reset(token)


def asked() -> bool:
    """Whether the caller asked for per-row scales (`per_row`)."""
    return _PER_ROW.get()


def quantize(rows: torch.Tensor, kernels=None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """rows `[M, K]` -> (int8 `[M, K]`, fp32 scales `[M, 1]`) with rows ~= int8 * scale, or None
    where a row holds an inf or a NaN (the float path keeps them). An all-zero row gets scale 1
    (its integers are all 0), and so does a row so small that its scale would underflow to 0
    (subnormal values of at most about 1e-43). Scaled in fp32 whatever the rows' dtype: two
    passes of gpt1's compiled module (`kernels`, `backend.int8_row_kernels()`:
    `kernels/int8_rows.cpp`) where given, else torch's operators; the same integers."""
    if kernels is not None and rows.is_cpu:
        qx, scale = kernels.quantize_rows(rows.contiguous())
        return None if qx is None else (qx, scale)
    return _quantize_in_torch(rows)


def _quantize_in_torch(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    x = rows.to(torch.float32, copy=True)  # scaled in place below: never the caller's rows
    amax = x.abs().amax(dim=1, keepdim=True)
    if not bool(torch.isfinite(amax).all()):
        return None
    scale = amax / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # 0: a row too small for it
    # |x| / scale <= 127 up to one rounding, which rounds back to 127: no clamp needed.
    return x.div_(scale).round_().to(torch.int8), scale


def quantize_u7(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """rows `[M, K]` -> (int8 `[M, K]`, fp32 scales `[M, 1]`) as the AVX2 kernel quantises them
    (`kernels/int8_rows.cpp`, `form` "u7"): each row's range [min(x, 0), max(x, 0)] in 127 steps,
    x ~= (u - z) * scale with u in [0, 127] and the zero point z = round(-min / scale); the
    integers returned are u - z (the kernel multiplies u and subtracts z times the weights' column
    sums: the same int32 sums). None where a row holds an inf or a NaN or spans more than fp32
    holds. Rounding is to nearest even throughout, in fp32, as the kernel's."""
    x = rows.to(torch.float32, copy=True)  # scaled in place below: never the caller's rows
    low = x.amin(dim=1, keepdim=True).clamp_(max=0.0)
    high = x.amax(dim=1, keepdim=True).clamp_(min=0.0)
    span = high - low
    if not bool(torch.isfinite(span).all()):
        return None
    scale = span / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # 0: a row too small for it
    zero = torch.round(-low / scale)
    u = x.div_(scale).round_().add_(zero).clamp_(0.0, 127.0)
    return u.sub_(zero).to(torch.int8), scale


FORMS = {"s8": _quantize_in_torch, "u7": quantize_u7}


def epilogue(
    scaled: torch.Tensor,
    x_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    kernels=None,
) -> torch.Tensor:
    """The kernel's fp32 output (sums times weight scales) times the row scales, plus the bias,
    in `dtype` (in one pass of the compiled module where `kernels` is given, as for `quantize`;
    may overwrite `scaled`)."""
    if kernels is not None and dtype in (torch.float32, torch.bfloat16) and scaled.dim() == 2:
        return kernels.scale_rows(scaled.contiguous(), x_scale, bias, dtype == torch.bfloat16)
    return _epilogue_in_torch(scaled, x_scale, bias, dtype)


def _epilogue_in_torch(
    scaled: torch.Tensor, x_scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor:
    out = scaled.mul_(x_scale)
    if bias is not None:
        out.add_(bias.float())
    return out.to(dtype)


def reference(
    x: torch.Tensor,
    q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    form: str = "s8",
) -> torch.Tensor:
    """The per-row product's arithmetic in plain torch, the activations quantised as `form`
    says (`FORMS`), the int32 sums exact (int64 here)."""
    rows = x.reshape(-1, x.shape[-1])
    found = FORMS[form](rows)
    assert found is not None, "non-finite activations have no per-row product"
    qx, x_scale = found
    sums = qx.long() @ q.long().t()
    out = _epilogue_in_torch(sums.to(torch.int32).float() * w_scale.float(), x_scale, bias, x.dtype)
    return out.view(*x.shape[:-1], q.shape[0])
