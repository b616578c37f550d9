"""Where the time of one decoding step of many sequences goes: its weight products, attention over
the caches, and the rest (LayerNorm, GELU, quantising each row, the Python around the call).

GPT-1 size, random weights, `--precision` (int8: the many-row integer step `BatchedDecoder`
runs; bf16/fp32: the one-call step, up to 8 rows at a time), every sequence a slot of one pool
as the server's are. For each row count R, alternating in one process, medians of `--rounds`:

- the step over caches of `--past` positions, and over caches of 2 (where attention reads
  almost nothing): their difference is what attending over the caches costs, printed with the
  rate at which it reads their keys and values;
- int8 only: the 48 block products alone on R rows (gpt1's kernel, `rows_product`), so that
  step - products - attention is the rest;
- the same step over caches of `--past` positions stored as `--against` (bf16 by default; the
  activations' own dtype; fp32), where that is not what `BatchedDecoder` stores, and how much
  faster `BatchedDecoder`'s caches make the step.

With `--decoder`, `BatchedDecoder` (what `gpt1 serve` runs) decodes R greedy generations
instead (random 32-token prompts, `--new` tokens each), split by where the time goes: the step
that reads their prompts together and the int8 products in it; then, per later step, the
compiled step, the output layer, the greedy choice, and the rest, the Python between them (the
compiled module's calls timed as they are made).

One thread and this process's CPU time by default (the machine may be shared); `--threads 2
--clock wall` for a step on two cores. The caches are `BatchedDecoder`'s (int8 rows with a
scale and a bias for int8, the activations' dtype otherwise: `int8_step.cache_dtype`), and their
read rate counts the bytes their rows take.

    python benchmarks/step_profile.py                        # int8, R = 1..64, 64 positions
    python benchmarks/step_profile.py --precision bf16 --rows 1,4,8 --past 256
    python benchmarks/step_profile.py --threads 2 --clock wall
    python benchmarks/step_profile.py --decoder --rows 8,64 --threads 2 --clock wall
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpt1 import GPT  # noqa: E402
from gpt1.config import model_preset  # noqa: E402
from gpt1.inference import backend, int8_rows, int8_step  # noqa: E402
from gpt1.inference.block_step import _int8_weights  # noqa: E402
from gpt1.inference.decoding import SlotPool, decode, forward_cached  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402

VOCAB = 40478
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
SHORT = 2  # positions cached where attention costs next to nothing
AGAINST = {"bf16": torch.bfloat16, "fp32": torch.float32, "activations": None}


def filled_pool(model: GPT, rows: int, past: int, dtype: torch.dtype | None) -> list:
    """`rows` caches, slots of one pool storing `dtype` (None: the activations'), each holding
    `past` positions of random tokens."""
    pool = SlotPool(model.config.n_layer, max(128, 2 * past), dtype)
    caches = [pool.cache() for _ in range(rows)]
    with torch.no_grad():
        for cache in caches:
            forward_cached(model, torch.randint(0, VOCAB, (1, past)), cache)
    return caches


def products(model: GPT, rows: int):
    """A call that runs every block's int8 product on `rows` random rows (gpt1's kernel)."""
    kernels = backend.kernel_module()
    inputs: dict[int, torch.Tensor] = {}
    calls = []
    for layer, q in _int8_weights(model):
        x = inputs.setdefault(q.shape[1], torch.randn(rows, q.shape[1]))
        calls.append((x, layer._packed.few_rows(q), layer.scale.float(), layer.bias, q.shape[0]))
    return lambda: [kernels.rows_product(x, w, s, b, n) for x, w, s, b, n in calls]


class _Timed:
    """The compiled module, each call's time added to `spent[name]`."""

    def __init__(self, module, spent: dict[str, float], clock) -> None:
        self._module, self._spent, self._clock = module, spent, clock

    def __getattr__(self, name: str):
        found = getattr(self._module, name)
        if not callable(found):
            return found

        def timed(*args, **kwargs):
            start = self._clock()
            try:
                return found(*args, **kwargs)
            finally:
                self._spent[name] += self._clock() - start

        return timed


def decoder_steps(model: GPT, rows: list[int], new: int, rounds: int, clock) -> None:
    """The `--decoder` table: `BatchedDecoder`'s steps of R generations, split by where the
    time goes."""
    spent: dict[str, float] = collections.defaultdict(float)
    real = backend.kernel_module
    timed = _Timed(real(), spent, clock)
    # Before the model's first step: the step's plan keeps the op it is first given
    # (`backend.decode_step_op` asks `kernel_module` for it).
    backend.kernel_module = lambda: timed
    try:
        _decoder_table(model, rows, new, rounds, clock, spent)
    finally:
        backend.kernel_module = real


def _decoder_table(model: GPT, rows: list[int], new: int, rounds: int, clock, spent) -> None:
    from gpt1.inference.batched import BatchedDecoder
    from gpt1.inference.sampling import Sampling

    print(
        "| sequences | prompts ms | their products ms | step ms | compiled step ms |"
        " output layer ms | greedy choice ms | the rest (Python) ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    greedy = Sampling(max_new_tokens=new, temperature=0.0)
    for n in rows:
        per_step: dict[str, list[float]] = collections.defaultdict(list)
        for round_ in range(rounds + 1):  # the first warms the plans and packed copies
            decoder = BatchedDecoder(model, speculate="off")
            for prompt in torch.randint(0, VOCAB, (n, 32)).tolist():
                decoder.add(prompt, greedy)
            spent.clear()
            start = clock()
            decoder.step()  # the prompts, read together
            prompts, prompt_products = clock() - start, spent["rows_product"]
            spent.clear()
            steps, start = 0, clock()
            while decoder.active:
                decoder.step()
                steps += 1
            if round_ == 0 or steps == 0:
                continue
            per_step["prompts"].append(prompts)
            per_step["prompt products"].append(prompt_products)
            per_step["step"].append((clock() - start) / steps)
            for name in ("decode_step", "rows_product", "greedy_tokens"):
                per_step[name].append(spent[name] / steps)
            per_step["rest"].append(per_step["step"][-1] - sum(spent.values()) / steps)
        cells = [
            statistics.median(per_step[k]) * 1e3
            for k in ("prompts", "prompt products", "step", "decode_step", "rows_product")
            + ("greedy_tokens", "rest")
        ]
        print(f"| {n} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=("int8", "bf16", "fp32"), default="int8")
    ap.add_argument("--rows", default="1,8,16,32,64")
    ap.add_argument("--past", type=int, default=64, help="positions each cache holds")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--decoder", action="store_true", help="BatchedDecoder's whole steps, split (see above)"
    )
    ap.add_argument("--new", type=int, default=64, help="with --decoder: tokens each generates")
    ap.add_argument(
        "--against",
        choices=tuple(AGAINST),
        default="bf16",
        help="the caches BatchedDecoder's are timed against (skipped where they are the same)",
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--clock", choices=tuple(CLOCKS), default="cpu", help="cpu: this process's CPU time"
    )
    args = ap.parse_args()
    if args.threads < 1 or args.rounds < 1:
        ap.error("--threads and --rounds must be at least 1")
    if args.decoder and args.new < 2:
        ap.error("--new must be at least 2: the steps after the prompts' are the ones timed")
    if args.clock == "cpu" and args.threads > 1:
        ap.error("--clock cpu adds up every thread's time: give --clock wall with --threads")
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = for_inference(GPT(model_preset("gpt1").derive(vocab_size=VOCAB)), "cpu", args.precision)
    if args.decoder:
        print(
            f"GPT-1 size, {args.precision}, BatchedDecoder, 32-token prompts, {args.new} new tokens,"
            f" {args.threads} thread(s), {'CPU' if args.clock == 'cpu' else 'wall'} time per step,"
            f" medians of {args.rounds}"
        )
        rows = [int(r) for r in args.rows.split(",")]
        with torch.inference_mode():
            decoder_steps(model, rows, args.new, args.rounds, clock)
        return
    integer = args.precision == "int8"
    C, L = model.config.n_embd, model.config.n_layer
    threads = "one thread" if args.threads == 1 else f"{args.threads} threads"
    print(
        f"GPT-1 size, {args.precision}, caches of {args.past} positions (and of {SHORT}),"
        f" {threads}, {'CPU' if args.clock == 'cpu' else 'wall'} time, medians of {args.rounds}"
    )
    activations = model.wte.weight.dtype
    decoders = int8_step.cache_dtype(model) or activations  # BatchedDecoder's caches
    against = AGAINST[args.against] or activations
    if against == torch.float32 and activations == torch.bfloat16:
        ap.error("--against fp32: the compiled step reads no fp32 caches under bf16 activations")
    compared = against != decoders
    print(f"Caches: {str(decoders).removeprefix('torch.')}")
    print(
        "| rows | step ms | attention ms | cache read GB/s | products ms | rest ms |"
        + (f" step ms, {args.against} caches | speed-up |" if compared else "")
    )
    print("|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if compared else ""))
    for rows in [int(r) for r in args.rows.split(",")]:
        ids = torch.randint(0, VOCAB, (rows,))
        caches = {past: filled_pool(model, rows, past, decoders) for past in (SHORT, args.past)}
        if compared:
            caches["wide"] = filled_pool(model, rows, args.past, against)
        buffer = caches[SHORT][0].pool.k[0]  # [slots, H, capacity, row]
        width = buffer.shape[-1] * buffer.element_size() / (C // model.config.n_head)
        timed = {past: [] for past in caches}
        timed["products"] = []
        run_products = products(model, rows) if integer else None

        def step(past: int | str) -> None:
            decode(model, ids, caches[past], one_call=not integer)
            for cache in caches[past]:
                cache.truncate(args.past if past == "wide" else past)

        with torch.no_grad(), int8_rows.per_row():
            for past in caches:
                step(past)  # warm: plans, packed copies, grown buffers
            for _ in range(args.rounds):
                for past in caches:
                    start = clock()
                    step(past)
                    timed[past].append(clock() - start)
                if run_products:
                    start = clock()
                    run_products()
                    timed["products"].append(clock() - start)
        whole, short = (statistics.median(timed[p]) for p in (args.past, SHORT))
        attention = whole - short
        read = rows * L * 2 * (args.past - SHORT) * C * width  # the extra keys and values read
        rate = f"{read / attention / 1e9:.1f}" if attention > 0 else "-"
        line = f"| {rows} | {whole * 1e3:.2f} | {attention * 1e3:.2f} | {rate} |"
        if run_products:
            made = statistics.median(timed["products"])
            line += f" {made * 1e3:.2f} | {(whole - attention - made) * 1e3:.2f} |"
        else:
            line += " - | - |"
        if compared:
            wide = statistics.median(timed["wide"])
            line += f" {wide * 1e3:.2f} | {wide / whole:.2f}x |"
        print(line, flush=True)


if __name__ == "__main__":
    main()
