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

It is C++ compiled for this CPU (`-march=native`: AVX-512 where the CPU has it, plain loops the
compiler vectorises elsewhere; `GPT1_KERNEL_MARCH=x86-64-v3` compiles for another target, to
measure what an AVX2 CPU runs) by torch's extension builder the first time it is needed, which
takes about 40 seconds and needs a C++ compiler and ninja. The build is kept in torch's extension
folder (`TORCH_EXTENSIONS_DIR`) under a name that digests the source, this CPU's feature flags
and the torch version and the compiler flags (the target), so any of them changing builds anew. Where it cannot be built, `kernel()`
returns None after one warning and callers use torch's kernels: slower, the same maths.
`GPT1_MATVEC=torch` chooses torch's kernels without building.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from gpt1.errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows: no flock; torch's own marker alone
    fcntl = None

log = logging.getLogger(__name__)
KERNELS = Path(__file__).resolve().parent / "kernels"
SOURCES = ("matvec.cpp", "step.cpp", "quantize.cpp", "module.cpp")  # compiled into one module
HEADERS = ("products.h", "lanes.h")
MAX_ROWS = 8  # the most rows one call takes (its accumulators live in registers)
DTYPES = (torch.int8, torch.bfloat16, torch.float32)  # the weight types it reads
# The instruction set the kernel is compiled for: `-march=` this (GPT1_KERNEL_MARCH, default
# `native`, this CPU); `x86-64-v3` builds the AVX2+FMA code a laptop runs, to measure it here.
MARCH_VARIABLE = "GPT1_KERNEL_MARCH"
_MARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")


def build_target() -> str:
    """The `-march=` target of the build: GPT1_KERNEL_MARCH (e.g. `x86-64-v3`), else `native`.
    Raises ConfigError, naming the variable, for a value that is not a target's name."""
    value = os.environ.get(MARCH_VARIABLE, "").strip() or "native"
    if not _MARCH_NAME.fullmatch(value):
        raise ConfigError(
            f"{MARCH_VARIABLE}={value!r} is not a compiler target name (e.g. native, "
            "x86-64-v3, skylake-avx512)"
        )
    return value


def _cflags() -> list[str]:
    # OpenMP: at::parallel_for on torch's threads.
    return ["-O3", f"-march={build_target()}", "-fopenmp"]


def _cpu_flags() -> str:
    """This CPU's feature flags (what -march=native compiles for), or its architecture's name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def _build_name() -> str:
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        digest.update((KERNELS / name).read_bytes())
    digest.update(_cpu_flags().encode() + torch.__version__.encode())
    digest.update(" ".join(_cflags()).encode())  # another build target is another build
    return f"gpt1_matvec_{digest.hexdigest()[:12]}"


def _build_directory(name: str) -> Path:
    """Where torch's builder keeps the build (`TORCH_EXTENSIONS_DIR`, else its default root)."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        get_default_build_root(), f"py{sys.version_info.major}{sys.version_info.minor}_cpu"
    )
    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _build():
    """Build (or find built) and import the kernel's module.

    torch's builder marks a build in progress with a file (`lock`) that a process killed in the
    middle leaves behind, and every later build then waits for it forever. So the build runs
    under an OS lock of our own (`flock`, released when its holder dies, however it dies): whoever
    holds it knows that no live process is building, and removes a `lock` left by a dead one."""
    from torch.utils.cpp_extension import load

    name = _build_name()
    folder = _build_directory(name)
    with open(folder.parent / f"{name}.flock", "a") as guard:
        if fcntl is not None:
            fcntl.flock(guard, fcntl.LOCK_EX)
        (folder / "lock").unlink(missing_ok=True)
        if not (folder / f"{name}.so").exists():
            log.info("building gpt1's decoding kernel for this CPU (once, about a minute)")
        return load(
            name=name,
            sources=[str(KERNELS / name) for name in SOURCES],
            extra_cflags=_cflags(),
            extra_ldflags=["-fopenmp"],
            build_directory=str(folder),
            verbose=False,
        )


def kernel() -> Callable[..., torch.Tensor] | None:
    """`matvec(x [M, K], w [N, K], scale [N] or None, bias [N] or None)` -> `[M, N]` in x's dtype
    (1 <= M <= MAX_ROWS, w contiguous in one of `DTYPES`, int8 with scales, all on the CPU); None
    where the kernel is not available."""
    built = module()
    return None if built is None else built.matvec


@functools.cache
def module():
    """The built kernels' module (`matvec`; `decode_step`, used by `gpt1.model.block_step`;
    `quantize_per_tensor`, used by `gpt1.model.quantize`), or None where they are not
    available."""
    if os.environ.get("GPT1_MATVEC", "") == "torch":
        return None
    build_target()  # a misspelt target is the user's mistake, said as such, not a failed build
    try:
        return _build()
    except Exception as e:  # no compiler, no ninja, a failed build: torch's kernels still work
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        warnings.warn(
            f"gpt1 could not build its decoding kernel ({first_line[:200]}); decoding uses "
            "torch's kernels, about half as fast (GPT1_MATVEC=torch silences this)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


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
