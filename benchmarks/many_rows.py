"""Passes of many rows (prompts read together, classification batches): GELU by table against
torch's, and a burst of prompts attending in one call against one call each, in one process.

Printed, one thread, each process's CPU time, medians of `--rounds` alternating rounds:

* GELU alone on bf16 tensors of 3072 columns (GPT-1's MLP width) and 32 to 2048 rows: torch's
  operator against gpt1's table lookup (`gpt1.inference.activations`), ns a number both ways,
  and whether the bits agree (they must: the table holds torch's results); then on fp32
  tensors, torch's against the decoding step's GELU (`activations.step_gelu`, what an int8
  model with fp32 activations takes), and their largest difference;
* a burst of prompts read together (`BatchedDecoder`'s prefill: 8 and 64 prompts of 32 tokens,
  what `benchmarks/concurrency.py` charges every system before its first token) and a
  classification-sized forward pass (32 sequences of 128 tokens), GPT-1 size, random weights,
  int8 and bf16, with every MLP's activation set to torch's GELU and to gpt1's in turn (the
  table for bf16 activations, the step's GELU for int8's fp32 ones);
* the same bursts (int8) with their fresh prompts attending in one call per layer
  (`decoding.PromptRows`) and one sequence at a time (each through `CachedTokens`, the
  general path that prompts of other lengths or with cached positions take), the same tokens
  both ways;
* the last block of a prompt's pass run on every row against on each prompt's last row alone
  (past its keys and values, which every position still writes: `forward_cached`'s and
  `prefill`'s `last_only`): one prompt of 400 tokens (`generate`'s first token) and a burst of
  64 prompts of 32, in each precision, the same first tokens both ways.

    python benchmarks/many_rows.py                 # this CPU
    python benchmarks/many_rows.py --tier avx2     # a laptop's AVX2 + FMA, simulated
    python benchmarks/many_rows.py --precisions int8   # no bf16 passes (slow without bf16)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiers import TIERS, enter_tier  # noqa: E402

VOCAB = 40478


def paired(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median CPU seconds of each run, the runs alternating (order flipped every round)."""
    for run in runs.values():
        run()  # warm
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.process_time()
            runs[name]()
            times[name].append(time.process_time() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def ns_a_number(x: torch.Tensor, ours: Callable, rounds: int) -> tuple[float, float]:
    """ns a number of torch's GELU and of `ours` on x, paired."""
    took = paired({"torch": lambda: F.gelu(x, approximate="tanh"), "ours": lambda: ours(x)}, rounds)
    return took["torch"] / x.numel() * 1e9, took["ours"] / x.numel() * 1e9


def gelu_alone(rounds: int) -> None:
    from gpt1.inference import activations, backend

    print("\n| rows x 3072 | torch's GELU ns/number | table ns/number | speed-up | same bits |")
    print("|---:|---:|---:|---:|---|")
    for rows in (32, 256, 2048):
        x = (torch.randn(rows, 3072) * 2).to(torch.bfloat16)
        same = torch.equal(
            activations.gelu(x).view(torch.int16), F.gelu(x, approximate="tanh").view(torch.int16)
        )
        torch_ns, ours_ns = ns_a_number(x, activations.gelu, rounds)
        print(
            f"| {rows} | {torch_ns:.2f} | {ours_ns:.2f} | {torch_ns / ours_ns:.2f}x |"
            f" {'yes' if same else 'NO'} |",
            flush=True,
        )
    built = backend.kernel_module()  # main() has built it
    if built is None or not built.has_decode_step():
        print("\n(fp32: the decoding step is not compiled for this CPU)")
        return
    print("\n| rows x 3072, fp32 | torch's GELU ns/number | the step's ns/number | speed-up |")
    print("|---:|---:|---:|---:|")
    for rows in (32, 256, 2048):
        x = torch.randn(rows, 3072) * 2
        torch_ns, ours_ns = ns_a_number(x, activations.step_gelu, rounds)
        print(
            f"| {rows} | {torch_ns:.2f} | {ours_ns:.2f} | {torch_ns / ours_ns:.2f}x |", flush=True
        )
    x = torch.linspace(-20, 20, 4_000_001)
    gap = (activations.step_gelu(x) - F.gelu(x, approximate="tanh")).abs().max().item()
    print(f"largest difference from torch's over [-20, 20]: {gap:.2e}")


def passes(rounds: int, precisions: list[str]) -> None:
    from gpt1 import GPT
    from gpt1.config import model_preset
    from gpt1.inference import activations
    from gpt1.inference.batched import BatchedDecoder
    from gpt1.inference.prepared import for_inference
    from gpt1.inference.sampling import Sampling
    from gpt1.model import gpt

    print("\n| precision | pass | torch's GELU ms | gpt1's GELU ms | speed-up |")
    print("|---|---|---:|---:|---:|")
    for precision in precisions:
        torch.manual_seed(0)
        model = for_inference(GPT(model_preset("gpt1").derive(vocab_size=VOCAB)), "cpu", precision)
        mlps = [block.mlp for block in model.h]
        ours = mlps[0].activation  # the table (bf16), the step's GELU (int8's fp32), or torch's
        if ours not in (activations.gelu, activations.step_gelu):
            print(f"| {precision} | (gpt1 keeps torch's GELU here: fp32 activations) | | | |")
            continue

        def with_gelu(fn: Callable[[], object], act: Callable) -> Callable[[], object]:
            def run() -> object:
                for mlp in mlps:
                    mlp.activation = act
                return fn()

            return run

        def burst(n: int) -> Callable[[], object]:
            prompts = torch.randint(0, VOCAB, (n, 32), generator=torch.Generator().manual_seed(n))

            def run() -> None:
                decoder = BatchedDecoder(model, speculate="off")
                for p in prompts.tolist():
                    decoder.add(p, Sampling(max_new_tokens=1, temperature=0.0))
                decoder.step()  # the prompts, read together, and each one's first token

            return run

        ids = torch.randint(0, VOCAB, (32, 128), generator=torch.Generator().manual_seed(1))
        cases = {
            "8 prompts x 32 read together": burst(8),
            "64 prompts x 32 read together": burst(64),
            "forward, 32 x 128 tokens": lambda: model(ids),
        }
        with torch.inference_mode():
            for name, fn in cases.items():
                took = paired(
                    {"torch": with_gelu(fn, gpt.gelu), "gpt1": with_gelu(fn, ours)}, rounds
                )
                print(
                    f"| {precision} | {name} | {took['torch'] * 1e3:.0f} |"
                    f" {took['gpt1'] * 1e3:.0f} | {took['torch'] / took['gpt1']:.2f}x |",
                    flush=True,
                )
        for mlp in mlps:
            mlp.activation = ours


def prompts_attending(rounds: int) -> None:
    from gpt1 import GPT
    from gpt1.config import model_preset
    from gpt1.inference.batched import BatchedDecoder
    from gpt1.inference.decoding import CachedTokens, PromptRows
    from gpt1.inference.prepared import for_inference
    from gpt1.inference.sampling import Sampling

    together = PromptRows.attend

    def one_by_one(self, qkv, n_head, dropout_p):  # each prompt its own call, its own growth
        parts = qkv.split(self.lengths)
        return torch.cat(
            [
                CachedTokens(layer, self.last_only).attend(part[None], n_head, dropout_p)[0]
                for layer, part in zip(self.layers, parts)
            ]
        )

    torch.manual_seed(0)
    model = for_inference(GPT(model_preset("gpt1").derive(vocab_size=VOCAB)), "cpu", "int8")
    print("\n| int8 burst | one call a prompt ms | one call a length ms | speed-up | same tokens |")
    print("|---|---:|---:|---:|---|")
    for n in (8, 64):
        prompts = torch.randint(0, VOCAB, (n, 32), generator=torch.Generator().manual_seed(n))
        firsts: dict[str, list] = {}

        def burst(attend, name: str) -> Callable[[], object]:
            def run() -> None:
                PromptRows.attend = attend
                decoder = BatchedDecoder(model, speculate="off")
                gens = [
                    decoder.add(p, Sampling(max_new_tokens=1, temperature=0.0))
                    for p in prompts.tolist()
                ]
                decoder.step()
                firsts[name] = [g.ids.tolist() for g in gens]

            return run

        try:
            with torch.inference_mode():
                took = paired(
                    {"alone": burst(one_by_one, "alone"), "grouped": burst(together, "grouped")},
                    rounds,
                )
        finally:
            PromptRows.attend = together
        same = "yes" if firsts["alone"] == firsts["grouped"] else "NO"
        print(
            f"| {n} prompts x 32 | {took['alone'] * 1e3:.0f} | {took['grouped'] * 1e3:.0f} |"
            f" {took['alone'] / took['grouped']:.2f}x | {same} |",
            flush=True,
        )


def last_rows(rounds: int, precisions: list[str]) -> None:
    from gpt1 import GPT
    from gpt1.config import model_preset
    from gpt1.inference import int8_step
    from gpt1.inference.decoding import KVCache, SlotPool, forward_cached, prefill
    from gpt1.inference.prepared import for_inference

    print(
        "\n| pass | precision | last block on every row ms | on the last rows ms | speed-up"
        " | same tokens |"
    )
    print("|---|---|---:|---:|---:|---|")
    gen = torch.Generator().manual_seed(400)
    lone = torch.randint(0, VOCAB, (1, 400), generator=gen)
    burst = list(torch.randint(0, VOCAB, (64, 1, 32), generator=gen))
    for precision in precisions:
        torch.manual_seed(0)
        model = GPT(model_preset("gpt1").derive(vocab_size=VOCAB))
        model = for_inference(model, "cpu", precision)
        dtype = int8_step.cache_dtype(model)
        firsts: dict[tuple[str, bool], list[int]] = {}

        def one_prompt(last_only: bool) -> Callable[[], object]:
            def run() -> None:
                cache = KVCache(model.config.n_layer, 512, dtype)
                hidden = forward_cached(model, lone, cache, last_only=last_only)[:, -1]
                firsts["lone", last_only] = model.lm_logits(hidden).argmax(-1).tolist()

            return run

        def prompts(last_only: bool) -> Callable[[], object]:
            def run() -> None:
                pool = SlotPool(model.config.n_layer, 64, dtype)
                caches = [pool.cache() for _ in burst]
                hidden = prefill(model, burst, caches, last_only=last_only)
                firsts["burst", last_only] = model.lm_logits(hidden).argmax(-1).tolist()

            return run

        for name, key, make in (
            ("one prompt x 400", "lone", one_prompt),
            ("64 prompts x 32", "burst", prompts),
        ):
            with torch.inference_mode():
                took = paired({"every": make(False), "last": make(True)}, rounds)
            same = "yes" if firsts[key, False] == firsts[key, True] else "NO"
            print(
                f"| {name} | {precision} | {took['every'] * 1e3:.0f} | {took['last'] * 1e3:.0f} |"
                f" {took['every'] / took['last']:.3f}x | {same} |",
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tier", choices=sorted(TIERS), default="host")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument(
        "--precisions",
        default="int8,bf16",
        help="the passes' precisions (bf16 is slow where the CPU has no bf16 instructions)",
    )
    args = p.parse_args()
    enter_tier(args.tier)
    torch.set_num_threads(1)
    from gpt1.inference import backend

    backend.expect_decoding()  # builds gpt1's kernel where it is not built
    if backend.kernel_module() is None:
        sys.exit("gpt1's compiled module is not here (GPT1_MATVEC=0, or it failed to build)")
    print(f"tier {args.tier}, one thread, CPU time, medians of {args.rounds} alternating rounds")
    gelu_alone(args.rounds)
    passes(args.rounds, args.precisions.split(","))
    prompts_attending(args.rounds)
    last_rows(args.rounds, args.precisions.split(","))


if __name__ == "__main__":
    main()
