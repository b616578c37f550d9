"""Sampled tokens drawn by gpt1's kernel (`kernels/choice.cpp`, `generate.draw_rows`) against
torch's operators (`filter_logits`, softmax and `draw`, a row at a time), in one process.

    python benchmarks/draws.py                                   # temperature 1; one thread
    python benchmarks/draws.py --temperature 0.8 --top-k 40 --threads 2

Two measures, each the kernel and torch's operators alternating, medians of `--rounds`:

- **the choice of a step**: n rows of GPT-1's 40,478 random logits (times 3), each with its own
  seeded generator, pushed out of the CPU's caches before each round as a step's weights push
  them (a 64 MB pass between rounds), chosen as `BatchedDecoder` chooses them: in one call of
  the kernel, or with torch's operators a row at a time;
- **whole runs** of `BatchedDecoder` (what `gpt1 serve` runs): GPT-1 size int8, random weights,
  n random 32-token prompts and `--new` tokens each (as `concurrency.py` makes them), prompt time
  included, every generation seeded.

One thread and this process's CPU time by default; with `--threads` above 1, wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from concurrency import VOCAB, _model, _prompts  # noqa: E402

from gpt1.inference import backend  # noqa: E402
from gpt1.inference import generate as generation  # noqa: E402
from gpt1.inference.batched import BatchedDecoder  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402
from gpt1.inference.sampling import Sampling  # noqa: E402


def drawing(kernel: bool):
    """Within it, draws take gpt1's kernel (as they do by default), or torch's operators (the
    kernel's draw reported absent)."""
    return (
        contextlib.nullcontext() if kernel else mock.patch.object(backend, "draw_op", lambda: None)
    )


def choose_step(logits: torch.Tensor, sampling: Sampling) -> None:
    """The rows' tokens as `BatchedDecoder._choose_each` draws them, each row seeded."""
    generators = [torch.Generator().manual_seed(s) for s in range(logits.shape[0])]
    rows = list(range(logits.shape[0]))
    if len(rows) > 1:
        if generation.draw_rows(logits, rows, [sampling] * len(rows), generators) is not None:
            return
    for r in rows:
        generation.choose(logits[r : r + 1].float(), sampling, generators[r])


def decode(model, sampling: Sampling, n: int, new: int) -> None:
    decoder = BatchedDecoder(model, speculate="off")
    for i, p in enumerate(_prompts(n, 32)):
        decoder.add(p, replace(sampling, max_new_tokens=new, seed=i))
    while decoder.active:
        decoder.step()


def paired(run, rounds: int, clock, before=None) -> tuple[float, float, list[float]]:
    """Median seconds of `run()` with torch's operators and with the kernel, rounds alternating
    (`before()`, untimed, ahead of each), and each round's speed-up (the two runs of a round
    back to back: the machine's other work moves both alike, where it moves the medians
    apart)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for kernel in (True, False) if r % 2 else (False, True):
            if before is not None:
                before()
            with drawing(kernel):
                start = clock()
                run()
                times[kernel].append(clock() - start)
    ratios = [t / k for t, k in zip(times[False], times[True])]
    return statistics.median(times[False]), statistics.median(times[True]), ratios


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ns", default="1,8,64")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--skip-runs", action="store_true", help="the choice of a step only")
    args = p.parse_args()
    if backend.draw_op() is None:
        sys.exit("draws: gpt1's kernel is not built here (python -m gpt1 kernels build)")
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    ns = [int(n) for n in args.ns.split(",")]
    options = f"temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}"
    print(f"{options}; {args.threads} thread(s), medians of {args.rounds} alternating rounds")
    print(
        "| measure | n | torch's operators | kernel | speed-up, median of the rounds | each round |"
    )
    print("|---|---:|---:|---:|---:|---|")
    flush = torch.empty(16 * 1024 * 1024)  # 64 MB: the logits leave the caches, as in a step
    for n in ns:
        logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(n)) * 3
        choose_step(logits, sampling)  # warm
        t, k, ratios = paired(
            lambda: choose_step(logits, sampling), args.rounds, clock, lambda: flush.add_(1.0)
        )
        rounds = ", ".join(f"{x:.2f}" for x in ratios)
        print(
            f"| choice of a step, ms | {n} | {t * 1e3:.2f} | {k * 1e3:.2f} | "
            f"{statistics.median(ratios):.2f}x | {rounds} |"
        )
    if args.skip_runs:
        return
    model = for_inference(_model(), "cpu", "int8")
    with torch.inference_mode():
        decode(model, sampling, 8, 4)  # warm: kernels, weights gathered
        for n in ns:
            t, k, ratios = paired(lambda: decode(model, sampling, n, args.new), args.rounds, clock)
            rounds = ", ".join(f"{x:.2f}" for x in ratios)
            print(
                f"| whole run, tokens/s | {n} | {n * args.new / t:.0f} | {n * args.new / k:.0f} | "
                f"{statistics.median(ratios):.2f}x | {rounds} |"
            )


if __name__ == "__main__":
    main()
