"""gpt1's decoding kernel built for two targets, side by side in one process: the weight products
of one GPT-1 decoding step (one row; each block's four layers, twelve blocks) per weight type,
this CPU's build (`-march=native`) against another (`GPT1_KERNEL_MARCH`, default `x86-64-v3`:
the AVX2 + FMA code a laptop runs), alternating.

Each build is made (or found) by `gpt1.inference.matvec`'s builder with the target set, so both are
the builds `gpt1` itself would load; the first run of a new target compiles it (minutes). The
two builds' products are checked to agree (fp32 sums in another order) before they are timed;
figures are the weight bytes read per second, the best of `--repeats`, on this thread's CPU
clock with one torch thread (`--clock wall` for the wall clock): on a shared machine the CPU
clock leaves out the time other jobs hold the core.

    python benchmarks/kernel_targets.py                     # native vs x86-64-v3
    python benchmarks/kernel_targets.py --target x86-64-v4 --repeats 9
    python benchmarks/kernel_targets.py --storage     # weights as loaded vs in one storage
    python benchmarks/kernel_targets.py --in-cache    # weights in L2: the arithmetic's limit
    python benchmarks/kernel_targets.py --against HEAD~1 --repeats 11   # another commit's kernel
    python benchmarks/kernel_targets.py --against HEAD~1 --rows 3       # three rows at a time

"bf16 pairs" is bf16 weights times a bf16 row (the bf16 precision's decoding); "bf16" widens
bf16 weights against an fp32 row.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gpt1.inference import arena, backend, kernel_build  # noqa: E402
from gpt1.inference.quantize import quantize_rows  # noqa: E402

SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * 12  # [out, in] of a step's layers
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def built_for(target: str):
    """The kernel's module built for `-march=target` (built now if it is not yet)."""
    before = os.environ.get(kernel_build.MARCH_VARIABLE)
    os.environ[kernel_build.MARCH_VARIABLE] = target
    kernel_build.module.cache_clear()  # the builder keeps one module per process
    try:
        built = kernel_build.module()
        if built is None:
            raise SystemExit(f"gpt1's kernel could not be built for -march={target}")
        return built
    finally:
        kernel_build.module.cache_clear()
        if before is None:
            del os.environ[kernel_build.MARCH_VARIABLE]
        else:
            os.environ[kernel_build.MARCH_VARIABLE] = before


def step_weights(
    kind: str, with_head: bool = False
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    return step_weights_of(kind, SHAPES + ([(40478, 768)] if with_head else []))


def step_weights_of(
    kind: str, shapes: list[tuple[int, int]]
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Random weights of `shapes` ([out, in]) as `kind` stores them, with int8's scales."""
    out = []
    for n, k in shapes:
        w = torch.randn(n, k)
        if kind == "int8":
            out.append(quantize_rows(w))
        else:
            out.append((w.to(torch.bfloat16) if kind.startswith("bf16") else w, None))
    return out


def gathered(weights: list[tuple[torch.Tensor, torch.Tensor | None]]) -> list[tuple]:
    """The same weights copied into one huge-page storage, in order, as `arena.gather` keeps
    a model's."""
    places = arena.views([(w.dtype, w.shape) for w, _ in weights])
    return [(view.copy_(w), s) for view, (w, s) in zip(places, weights)]


def best_times(cases: dict, x: dict, repeats: int, clock) -> dict[str, float]:
    """The best time of each case (name -> (built module, weights)) over `repeats` rounds, the
    cases taken in turns within each round, in reverse order every other round (whichever
    went first in every round read about 5% faster in runs of otherwise equal code)."""
    best = dict.fromkeys(cases, float("inf"))
    for round_ in range(repeats):
        order = list(cases.items())
        for name, (built, weights) in order if round_ % 2 == 0 else order[::-1]:
            start = clock()
            for w, s in weights:
                built.matvec(x[w.shape[1]], w, s, None)
            best[name] = min(best[name], clock() - start)
    return best


def compare_storage(repeats: int, clock) -> None:
    built = built_for("native")
    print(
        f"one row through a decoding step's 49 weight products, 1 thread, huge pages: "
        f"{backend.huge_pages()}"
    )
    for kind in KINDS:
        x = activations(kind)
        loaded = step_weights(kind, with_head=True)
        ways = {"as loaded": loaded, "gathered": gathered(loaded)}
        total = sum(w.numel() * w.element_size() for w, _ in loaded)
        best = best_times({name: (built, w) for name, w in ways.items()}, x, repeats, clock)
        rates = "  ".join(f"{name} {total / t / 1e9:5.1f} GB/s" for name, t in best.items())
        print(
            f"  {kind}: {rates}  (gathered / as loaded {best['as loaded'] / best['gathered']:.2f}x)"
        )


KINDS = ("int8", "bf16", "fp32", "bf16 pairs")  # "bf16 pairs": bf16 weights times bf16 rows


def activations(kind: str, rows: int = 1) -> dict[int, torch.Tensor]:
    """`rows` rows for each width the products take: fp32, or bf16 for bf16 pairs (the bf16
    precision decodes with bf16 activations)."""
    dtype = torch.bfloat16 if kind == "bf16 pairs" else torch.float32
    return {k: torch.randn(rows, k).to(dtype) for k in (768, 3072)}


def compare_in_cache(repeats: int, clock) -> None:
    """What the instructions alone sustain: one row through a 384 KB weight that stays in L2,
    against the memory read bandwidth the decoding bound is made of. A kind whose in-cache rate
    is near that bandwidth is limited by its arithmetic, not by memory."""
    from inference import read_bandwidth  # benchmarks/inference.py

    built = built_for("native")
    memory = read_bandwidth()
    print(
        f"one row through a weight held in L2 (384 KB, 1 thread, {backend.huge_pages()}); "
        f"memory read bandwidth {memory / 1e9:.1f} GB/s"
    )
    for kind in KINDS:
        dtype = {"int8": torch.int8, "fp32": torch.float32}.get(kind, torch.bfloat16)
        rows = (384 << 10) // (768 * torch.empty(0, dtype=dtype).element_size())
        w, scale = step_weights_of(kind, [(rows, 768)])[0]
        x = activations(kind)[768]
        for _ in range(20):
            built.matvec(x, w, scale, None)
        best, calls = float("inf"), 400
        for _ in range(repeats):
            start = clock()
            for _ in range(calls):
                built.matvec(x, w, scale, None)
            best = min(best, clock() - start)
        rate = w.numel() * w.element_size() * calls / best
        print(f"  {kind}: {rate / 1e9:5.1f} GB/s of weights ({rate / memory:.0%} of memory's)")


def built_from(revision: str):
    """The kernel's module built from its sources at git `revision` with this checkout's flags
    (`gpt1.inference.matvec`: the target, `GPT1_KERNEL_MARCH`), in a folder of its own under the
    extension folder, named by the commit and the flags; found there on later runs."""
    import subprocess

    from torch.utils.cpp_extension import load

    def git(*args: str) -> bytes:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"git {' '.join(args)}: {done.stderr.decode().strip()}")
        return done.stdout

    commit = git("rev-parse", "--short=12", revision).decode().strip()
    flags = hashlib.sha256(" ".join(kernel_build._cflags()).encode()).hexdigest()[:8]
    name = f"gpt1_matvec_at_{commit}_{flags}"
    folder = kernel_build.build_root() / name
    sources = folder / "sources"
    sources.mkdir(parents=True, exist_ok=True)
    kernels = kernel_build.KERNELS.relative_to(ROOT).as_posix()
    # That revision's own files: its sources need not be this checkout's.
    files = git("ls-tree", "--name-only", f"{commit}:{kernels}").decode().split()
    for file in files:
        (sources / file).write_bytes(git("show", f"{commit}:{kernels}/{file}"))
    print(f"building (or finding) the kernel of {commit} in {folder}", flush=True)
    return load(
        name=name,
        sources=[str(sources / file) for file in files if file.endswith(".cpp")],
        extra_cflags=kernel_build._cflags(),
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )


def compare_revision(revision: str, repeats: int, clock_name: str, rows: int = 1) -> None:
    """This checkout's kernel against `revision`'s, both built for `GPT1_KERNEL_MARCH` (default
    native), `rows` rows through a step's 49 products on gathered weights, alternating in turns;
    the two builds' results are compared bit for bit."""
    target, clock = kernel_build.build_target(), CLOCKS[clock_name]  # GPT1_KERNEL_MARCH, or native
    builds = {revision: built_from(revision), "this checkout": built_for(target)}
    print(
        f"{rows} row(s) through a decoding step's 49 weight products, -march={target}, "
        f"1 thread, {clock_name} clock"
    )
    for kind in KINDS:
        x = activations(kind, rows)
        weights = gathered(step_weights(kind, with_head=True))
        total = sum(w.numel() * w.element_size() for w, _ in weights)
        same = all(
            torch.equal(*(m.matvec(x[w.shape[1]], w, s, None) for m in builds.values()))
            for w, s in weights[:8]
        )
        best = best_times({n: (m, weights) for n, m in builds.items()}, x, repeats, clock)
        rates = "  ".join(f"{name} {total / t / 1e9:5.1f} GB/s" for name, t in best.items())
        ratio = best[revision] / best["this checkout"]
        bits = "the same bits" if same else "results differ in their last bits"
        print(f"  {kind}: {rates}  (this / {revision} {ratio:.2f}x; {bits})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="x86-64-v3")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--clock", choices=CLOCKS, default="cpu")
    p.add_argument("--storage", action="store_true", help="as loaded vs gathered, this CPU's build")
    p.add_argument(
        "--in-cache", action="store_true", help="weights held in L2: the instructions' own rate"
    )
    p.add_argument("--against", metavar="REV", help="this checkout's kernel vs git REV's")
    p.add_argument("--rows", type=int, default=1, help="rows of activations (--against)")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    clock = CLOCKS[args.clock]
    if args.storage:
        compare_storage(args.repeats, clock)
        return
    if args.in_cache:
        compare_in_cache(args.repeats, clock)
        return
    if args.against:
        compare_revision(args.against, args.repeats, args.clock, args.rows)
        return
    builds = {"native": built_for("native"), args.target: built_for(args.target)}
    print(f"one row through a decoding step's 48 weight products, 1 thread, {args.clock} clock")
    for kind in KINDS:
        x = activations(kind)
        weights = step_weights(kind)
        total = sum(w.numel() * w.element_size() for w, _ in weights)
        outs = {
            name: [m.matvec(x[w.shape[1]], w, s, None) for w, s in weights]
            for name, m in builds.items()
        }
        for a, b in zip(*outs.values()):
            tol = 1e-4 if a.dtype == torch.float32 else 8e-3  # bf16 results: their rounding
            torch.testing.assert_close(a, b, rtol=tol, atol=tol * float(a.abs().max()))
        best = best_times({n: (m, weights) for n, m in builds.items()}, x, args.repeats, clock)
        rates = "  ".join(f"{name} {total / t / 1e9:5.1f} GB/s" for name, t in best.items())
        ratio = best["native"] / best[args.target]
        print(f"  {kind}: {rates}  ({args.target} / native {ratio:.2f}x; results agree)")


if __name__ == "__main__":
    main()
