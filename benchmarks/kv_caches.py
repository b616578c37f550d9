"""Whole runs of `BatchedDecoder` (what `gpt1 serve` runs) with the int8 model's keys and values
cached as int8 rows (`int8_step.cache_dtype`, the default) against bf16 caches, in one process.

    python benchmarks/kv_caches.py                          # n = 8, 64; one thread; 5 rounds
    python benchmarks/kv_caches.py --ns 64 --threads 2 --prompt 256

GPT-1 size, random weights and prompts as `concurrency.py` makes them (`--prompt` random tokens,
`--new` new tokens each, greedy), the weights gathered as the server gathers them. For each n the
two kinds of cache alternate, each round a fresh decoder decoding all n generations, prompt time
included: median seconds, tokens/s, the speed-up, and the share of tokens the two runs chose
alike (random weights give flat logits, so a near tie can go either way; a trained model's
numerics are in `int8_rows_numerics.py`). One thread and this process's CPU time by default;
with `--threads` above 1, wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from concurrency import _model, _prompts  # noqa: E402

from gpt1.inference import int8_step  # noqa: E402
from gpt1.inference.batched import BatchedDecoder  # noqa: E402
from gpt1.inference.decoding import SlotPool  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402
from gpt1.inference.sampling import Sampling  # noqa: E402


def run(model, dtype: torch.dtype, n: int, prompt: int, new: int, clock) -> tuple[float, list]:
    """n greedy generations decoded together, their caches storing `dtype`: (seconds, tokens)."""
    decoder = BatchedDecoder(model, speculate="off")
    decoder.pool = SlotPool(model.config.n_layer, decoder.n_positions, dtype)
    for ids in _prompts(n, prompt):
        decoder.add(ids, Sampling(max_new_tokens=new, temperature=0))
    tokens: list[int] = []
    start = clock()
    while decoder.active:
        tokens += [t for _, t in decoder.step() if isinstance(t, int)]
    return clock() - start, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="8,64", help="generations decoded together")
    ap.add_argument("--prompt", type=int, default=32, help="tokens of each prompt")
    ap.add_argument("--new", type=int, default=64, help="tokens each generates")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if min(args.threads, args.rounds, args.prompt, args.new) < 1:
        ap.error("--threads, --rounds, --prompt and --new must be at least 1")
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    model = for_inference(_model(), "cpu", "int8")
    if int8_step.cache_dtype(model) != torch.int8:
        raise SystemExit("the compiled step is not here: the int8 model caches its activations")
    if args.prompt + args.new > model.config.n_positions:
        ap.error(f"--prompt + --new must fit the context ({model.config.n_positions})")
    kinds = {"bf16": torch.bfloat16, "int8": torch.int8}
    print(
        f"GPT-1 size, int8, {args.prompt}-token prompts, {args.new} new tokens, {args.threads}"
        f" thread(s), {'CPU' if args.threads == 1 else 'wall'} time, medians of {args.rounds}"
    )
    print("| n | bf16 caches s | int8 caches s | tokens/s bf16 / int8 | speed-up | same tokens |")
    print("|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        run(model, torch.int8, 2, args.prompt, 2, clock)  # plans, packed copies, the probe
        for n in [int(n) for n in args.ns.split(",")]:
            times: dict[str, list[float]] = {name: [] for name in kinds}
            tokens: dict[str, list[int]] = {}
            for round_ in range(args.rounds):
                order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
                for name in order:
                    took, tokens[name] = run(model, kinds[name], n, args.prompt, args.new, clock)
                    times[name].append(took)
            bf16, int8 = (statistics.median(times[name]) for name in kinds)
            count = len(tokens["int8"])
            same = sum(a == b for a, b in zip(tokens["bf16"], tokens["int8"])) / count
            print(
                f"| {n} | {bf16:.2f} | {int8:.2f} | {count / bf16:.0f} / {count / int8:.0f} |"
                f" {bf16 / int8:.3f}x | {same:.1%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
