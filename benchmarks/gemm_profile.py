"""Time spent in GEMM kernels, for the benchmarks' "GEMM-bound ceiling" lines.

GEMMs are the work no implementation can skip (both sides of a benchmark run the same matrix
products), so the reference's time divided by gpt1's GEMM time bounds the speedup any removal of
gpt1's other work could reach on those inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm"}


def gemm_seconds(fn: Callable[[], object]) -> tuple[float, float]:
    """(seconds in GEMM kernels, wall seconds) of one call of `fn` under torch.profiler
    (GEMM time is the kernels' self time; the wall time is inflated by the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    gemm = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in GEMM_OPS) / 1e6
    return gemm, wall
