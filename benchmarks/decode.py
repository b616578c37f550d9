"""Decoding overheads at GPT-1 size (random weights): what a step costs beyond its weight products,
and batched decoding with pooled vs per-sequence attention.

Batch 1 (`--skip batched` to run only this): for each precision, `gpt1.inference.generate.generate`
(greedy, `--new` tokens after a 32-token prompt, the KV-cache path `gpt1 sample` runs) on the model
made ready by `for_inference`, its weights gathered into one storage as a server keeps them
(`prepare_to_decode`), alternating with its weight products alone ("weights": every linear layer
and the output layer called once on one row from Python, in the same kernels; the floor of a step
that runs its blocks as operators, above a one-call step, which makes none of those 49 calls) and
with the sampling path alone (`next_tokens` on one row of logits; "(before)": the full `isfinite`
check and `argmax` it replaced); "other" is a step minus the two (negative where the one-call step
runs: it makes none of the 49 calls "weights" pays for). The decoding bound (the bytes a step reads
over the read bandwidth, `inference.PlainReads`, measured beside each timed round: the host's
memory speed drifts within minutes) is printed beside each on the wall clock, with each round's
step against its own round's bound: their median and range (on the CPU clock a step's time and the
bandwidth are not comparable: "-"). Below the table, a step beside the kernels it runs called back
to back with no Python between them (`kernels_alone`: the one-call step, the output layer and the
greedy choice, taking turns with the rest in the same rounds): the difference is what generation's
Python and torch operators cost a token.

Batched (`gpt1.inference.decoding.decode`, what `gpt1 serve` runs for concurrent generations): n sequences with
prompts of different lengths (`--context`, 16..48 tokens) advance `--steps` tokens together, with their
caches in one `SlotPool` (one attention call per layer) vs each in its own `KVCache` (one call
per sequence and layer), alternating in one process; steps/s and the ratio. Each timed run
starts from the same prefilled caches (rewound, not refilled).

    python benchmarks/decode.py                                  # everything, 3 repeats
    python benchmarks/decode.py --skip batched --precisions bf16 # batch-1 breakdown only
    python benchmarks/decode.py --skip batch1 --sizes 1,4,16     # pooled vs looped only
    python benchmarks/decode.py --threads 1 --clock cpu          # on a loaded machine
    python benchmarks/decode.py --skip batch1 --context 200,400  # longer contexts

Read bandwidth is always measured on the wall clock.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from inference import PlainReads, decode_bytes  # noqa: E402

from gpt1.config import model_preset  # noqa: E402
from gpt1.inference import backend, block_step  # noqa: E402
from gpt1.inference.decoding import (  # noqa: E402
    KVCache,
    SlotPool,
    decode,
    forward_cached,
    prepare_to_decode,
)
from gpt1.inference.generate import generate, next_tokens  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402
from gpt1.inference.quantize import Int8Linear, int8_linear, quantize_rows  # noqa: E402
from gpt1.inference.sampling import Sampling  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
GREEDY = Sampling(temperature=0)  # the sampling path alone: the choice, not the new tokens
clock = CLOCKS["wall"]


def alternate(systems: dict, repeats: int) -> dict[str, list[float]]:
    """Warm each system up once, then time them in turn, `repeats` rounds, on `clock`."""
    for fn in systems.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(repeats):
        for name, fn in systems.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return times


def weight_products(model: GPT):
    """One call of every linear layer and the output layer on one row, as a decoding step
    makes them."""
    dtype = model.wte.weight.dtype
    linears = [
        m for m in model.h.modules() if isinstance(m, (torch.nn.Linear, Int8Linear))
    ]  # c_attn, c_proj, c_fc, c_proj per block
    rows = [torch.randn(1, m.in_features).to(dtype) for m in linears]
    hidden = torch.randn(1, model.config.n_embd).to(dtype)

    @torch.no_grad()
    def run() -> None:
        for m, x in zip(linears, rows):
            m(x)
        model.lm_logits(hidden)

    return run


def isfinite_argmax(logits: torch.Tensor) -> torch.Tensor:
    """The greedy sampling path as it was: a full `isfinite` check, then `argmax`."""
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("non-finite logits")
    return logits.argmax(-1, keepdim=True)


def batch1(precisions: list[str], new: int, repeats: int) -> None:
    reads = PlainReads()
    print(
        f"\nbatch 1, greedy, {new} new tokens after 32; the bound read beside each round "
        f"(median; its rounds' range)"
    )
    print(
        f"{'precision':>9} {'step ms':>8} {'weights':>8} {'sampling':>9} {'(before)':>9} "
        f"{'other':>7} {'GB/s':>5} {'bound ms':>9} {'of bound':>9} {'range':>9}"
    )
    prompt = torch.randint(0, 40000, (1, 32))
    kept: list[str] = []
    for precision in precisions:
        torch.manual_seed(0)
        model = for_inference(GPT(model_preset("gpt1")), "cpu", precision)
        prepare_to_decode(model)  # the weights in one storage, as a server keeps them
        products = weight_products(model)
        logits = torch.randn(1, model.config.vocab_size)
        rates: list[float] = []
        systems = {
            "step": lambda: generate(model, prompt, new, temperature=0),
            "prefill": lambda: generate(model, prompt, 1, temperature=0),
            "read": lambda: rates.append(reads.rate()),
            "weights": lambda: [products() for _ in range(new)],
            "sampling": lambda: [next_tokens(logits, GREEDY, None) for _ in range(new)],
            "sampling before": lambda: [isfinite_argmax(logits) for _ in range(new)],
        }
        kernels = kernels_alone(model, prompt, new)
        if kernels is not None:
            systems["kernels"] = kernels
        times = alternate(systems, repeats)
        rates = rates[1:]  # the warm-up round's read is not beside a timed step
        med = {k: statistics.median(v) for k, v in times.items()}
        step = (med["step"] - med["prefill"]) / (new - 1) * 1e3
        weights, sampling = med["weights"] / new * 1e3, med["sampling"] / new * 1e3
        before = med["sampling before"] / new * 1e3
        step_bytes = decode_bytes(model, context=32 + new // 2)
        # Each round's step against the bound of the read made beside it, in the same minute.
        shares = [
            step_bytes / rate / ((s - p) / (new - 1))
            for rate, s, p in zip(rates, times["step"], times["prefill"])
        ]
        rate = statistics.median(rates)
        bound = step_bytes / rate * 1e3
        of_bound = (
            f"{rate / 1e9:5.1f} {bound:9.2f} {statistics.median(shares):9.0%} "
            f"{min(shares):4.0%}-{max(shares):.0%}"
            if clock is time.perf_counter
            else " " * 5 + " " * 9 + " " * 9 + "-"
        )
        print(
            f"{precision:>9} {step:8.2f} {weights:8.2f} {sampling:9.3f} {before:9.3f} "
            f"{step - weights - sampling:7.2f} {of_bound}"
        )
        if kernels is not None:
            # The kernels' loop also runs the prompt and its token's choice (as `generate`
            # does): taken off the same way.
            alone = (med["kernels"] - med["prefill"]) / (new - 1) * 1e3
            kept.append(
                f"{precision:>9} {step:9.2f} {alone:9.2f} {step - alone:9.3f} "
                f"{(step - alone) / step:7.1%}"
            )
    if kept:
        print(
            "a step beside its kernels alone (the one-call step, the output layer and the greedy "
            "choice called back to back, no Python between them), ms a token:\n"
            f"{'precision':>9} {'step':>9} {'kernels':>9} {'the rest':>9} {'of step':>7}"
        )
        print("\n".join(kept))


def kernels_alone(model: GPT, prompt: torch.Tensor, new: int):
    """A run of the kernels a greedy generation of `new` tokens after `prompt` makes, called
    back to back from a loop with nothing else in it (the prompt, then the one-call step over the
    same cache, the output layer and the greedy choice a token): timed beside `generate`, the
    difference is what generation's Python and torch operators cost a token. None where the
    one-call step does not apply (the blocks run as operators)."""
    greedy = backend.greedy_op()
    x = torch.zeros(1, model.config.n_embd, dtype=model.h[0].ln_1.weight.dtype)
    with torch.no_grad():
        step = block_step.plan(model, x)
    if step is None or greedy is None:
        return None
    start = prompt.shape[1]

    @torch.no_grad()
    def kernels() -> None:
        cache = KVCache(model.config.n_layer, model.config.n_positions)
        greedy(model.lm_logits(forward_cached(model, prompt, cache)[:, -1]).float())  # as generate
        buffers = [layer.room(start + new) for layer in cache.layers]
        keys, values = [b[0] for b in buffers], [b[1] for b in buffers]
        for i in range(new - 1):
            hidden = step.run(x, keys, values, [0], [start + i])
            greedy(model.lm_logits(hidden).float())

    return kernels


def call_overhead(repeats: int, calls: int = 20000) -> None:
    """What the int8 product's Python wrapper adds to its kernel, on a layer small enough for
    the kernel to take microseconds (decoding makes 49 such calls per token)."""
    q, scale = quantize_rows(torch.randn(64, 64))
    x, bias, scale = torch.randn(1, 64).bfloat16(), torch.randn(64).bfloat16(), scale.bfloat16()
    kernel = torch.ops.aten._weight_int8pack_mm
    times = alternate(
        {
            "int8_linear": lambda: [int8_linear(x, q, scale, bias) for _ in range(calls)],
            "kernel": lambda: [kernel(x, q, scale).add_(bias) for _ in range(calls)],
        },
        repeats,
    )
    wrapper, bare = (statistics.median(times[k]) / calls * 1e6 for k in ("int8_linear", "kernel"))
    print(f"\nint8_linear on a 64x64 layer: {wrapper:.1f} us per call, kernel + bias {bare:.1f} us")


def prefilled(
    model: GPT, n: int, pooled: bool, context: tuple[int, int]
) -> tuple[list[KVCache], list[int]]:
    gen = torch.Generator().manual_seed(n)
    lengths = torch.randint(context[0], context[1] + 1, (n,), generator=gen).tolist()
    pool = SlotPool(model.config.n_layer, model.config.n_positions)
    caches = [pool.cache() if pooled else KVCache(model.config.n_layer, 512) for _ in lengths]
    with torch.no_grad():
        for cache, length in zip(caches, lengths):
            forward_cached(model, torch.randint(0, 40000, (1, length), generator=gen), cache)
    return caches, lengths


def decode_run(model: GPT, caches: list[KVCache], lengths: list[int], steps: int):
    ids = torch.randint(0, 40000, (len(caches),))

    @torch.no_grad()
    def run() -> None:
        for cache, length in zip(caches, lengths):  # rewind: every run decodes the same steps
            for layer in cache.layers:
                layer.length = length
        for _ in range(steps):
            model.lm_logits(decode(model, ids, caches)).float().argmax(-1)

    return run


def batched(
    precisions: list[str], sizes: list[int], steps: int, repeats: int, context: tuple[int, int]
) -> None:
    print(
        f"\nbatched decoding, {steps} steps, prompts {context[0]}..{context[1]} tokens: "
        "steps/s (median)"
    )
    print(f"{'precision':>9} {'n':>3} {'looped':>8} {'pooled':>8} {'pooled/looped':>14}")
    for precision in precisions:
        torch.manual_seed(0)
        model = for_inference(GPT(model_preset("gpt1")), "cpu", precision)
        for n in sizes:
            runs = {
                name: decode_run(model, *prefilled(model, n, name == "pooled", context), steps)
                for name in ("looped", "pooled")
            }
            times = alternate(runs, repeats)
            rate = {k: steps / statistics.median(v) for k, v in times.items()}
            print(
                f"{precision:>9} {n:3d} {rate['looped']:8.2f} {rate['pooled']:8.2f} "
                f"{rate['pooled'] / rate['looped']:13.2f}x"
            )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--precisions", default="fp32,bf16,int8")
    p.add_argument("--new", type=int, default=64, help="batch-1 new tokens per run")
    p.add_argument("--sizes", default="1,4,16", help="concurrent sequences (batched)")
    p.add_argument("--steps", type=int, default=16, help="batched steps per run")
    p.add_argument("--context", default="16,48", help="batched prompt lengths: lo,hi")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--skip", default="", help="comma list of: batch1, batched")
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="cpu: this process's CPU time (with --threads 1, the work done, less sensitive "
        "to other jobs on a loaded machine than wall time)",
    )
    args = p.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    precisions = args.precisions.split(",")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {os.getloadavg()[0]:.1f} at start, {time.strftime('%Y-%m-%d %H:%M')}"
    )
    if "batch1" not in skip:
        call_overhead(args.repeats)
        batch1(precisions, args.new, args.repeats)
    if "batched" not in skip:
        sizes = [int(s) for s in args.sizes.split(",")]
        lo, hi = (int(s) for s in args.context.split(","))
        batched(precisions, sizes, args.steps, args.repeats, (lo, hi))
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
