"""Where a model runs and in what precision: one spelling and one default ("auto") everywhere.

* device: `auto` (the default) is the first CUDA device when one is available, else the CPU;
  `cpu`, `cuda` and `cuda:N` ask for that device and fail clearly when it is not there.
* precision: `auto` (the default) is bf16 on a CUDA device that supports it and fp32 otherwise.
  On the CPU fp32 is both the exact and the fastest choice here (bf16 matrix products gave no gain
  on the CPUs measured), so `auto` never trades accuracy there. On a GPU bf16 halves memory
  traffic; training uses it as autocast over fp32 weights, inference casts the weights.
  `fp16` is for inference only (training in fp16 would need loss scaling, which gpt1 does not do).
  `int8` is for CPU inference only: int8 weights with per-channel scales, activations in bf16
  (`gpt1.inference.prepared`, `gpt1.inference.quantize`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpt1.errors import ConfigError

if TYPE_CHECKING:  # torch is imported by the functions: the CLI reads the help texts without it
    import torch

DEVICE_HELP = "auto (default: cuda if available, else cpu), cpu, cuda or cuda:N"
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
TRAIN_PRECISIONS = ("auto", "fp32", "bf16")
SERVE_PRECISIONS = ("auto", "fp32", "bf16", "int8")  # what `gpt1 serve` runs: no fp16
PRECISION_HELP = (
    "auto (default: bf16 on a GPU that supports it, fp32 otherwise), fp32, bf16, fp16 or"
    " int8 (CPU: int8 weights, bf16 activations)"
)
TRAIN_PRECISION_HELP = (
    "auto (default: bf16 autocast on a GPU that supports it, fp32 otherwise),"
    " fp32 or bf16 (autocast)"
)
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def resolve_device(name: str | None = "auto", local_rank: int | None = None) -> torch.device:
    """`auto` -> cuda when available else cpu; `cpu`, `cuda`, `cuda:N` checked to exist.

    With `local_rank` (the training loop, one process per GPU under torchrun) `auto` and `cuda`
    mean this process's GPU, `cuda:<local_rank>`; an explicit `cuda:N` is kept as asked.
    """
    import torch

    name = (name or "auto").strip().lower()
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}; expected {DEVICE_HELP}") from None
    if device.type == "cuda" and device.index is None and local_rank is not None:
        device = torch.device("cuda", local_rank)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {name!r} asked for, but no CUDA device is available "
                "(use --device cpu or auto)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s)"
            )
    elif device.type != "cpu":
        raise ConfigError(f"unsupported device {name!r}; expected {DEVICE_HELP}")
    return device


def resolve_precision(
    name: str | None, device: torch.device | str, allowed: tuple[str, ...] = PRECISIONS
) -> str:
    """`auto` -> bf16 on a bf16-capable CUDA device, else fp32; others checked against `allowed`."""
    import torch

    name = (name or "auto").strip().lower()
    if name not in allowed:
        raise ConfigError(f"precision must be one of {', '.join(allowed)}, got {name!r}")
    if name != "auto":
        return name
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


def torch_dtype(precision: str) -> torch.dtype:
    """The torch dtype of a resolved precision name (fp32, bf16, fp16)."""
    import torch

    if precision not in DTYPE_NAMES:
        raise ConfigError(f"precision must be one of {', '.join(DTYPE_NAMES)}, got {precision!r}")
    return getattr(torch, DTYPE_NAMES[precision])
