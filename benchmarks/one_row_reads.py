"""One sequence decoded with each of the two ways gpt1's kernel reads one row of fp32 weights or
of bf16 pairs: a channel at a time (the matrix as one forward stream) or several channels side by
side, as for more rows. `gpt1.inference.backend` times the two on four blocks' products and
takes the faster (`gpt1 kernels probe`); this measures what each gives a whole generation.

GPT-1 size, random weights, greedy, 64 new tokens after 32, one thread, this process's CPU time;
the two readings alternate in one process (the order turns each round), medians of `--rounds`,
after one warm-up generation. The tokens are checked to be the same both ways.

    python benchmarks/one_row_reads.py --precisions fp32,bf16 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpt1.config import model_preset  # noqa: E402
from gpt1.inference import backend  # noqa: E402
from gpt1.inference.decoding import prepare_to_decode  # noqa: E402
from gpt1.inference.generate import generate_stream  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402
from gpt1.inference.sampling import Sampling  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402

GREEDY = Sampling(max_new_tokens=64, temperature=0.0)
WAYS = {"a channel at a time": True, "side by side": False}


def rate(model, prompt: torch.Tensor) -> tuple[float, list[int]]:
    """Tokens/s after the first token, and the tokens."""
    steps = generate_stream(model, prompt, GREEDY)
    tokens = [int(next(steps))]
    start = time.process_time()
    tokens += [int(t) for t in steps]
    return (len(tokens) - 1) / (time.process_time() - start), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    module = backend.kernel()  # built if need be
    if module is None:
        sys.exit("gpt1's kernel is not usable here")
    module = backend.kernel_module()
    print("| precision | " + " | ".join(f"{w} tok/s" for w in WAYS) + " | side by side / stream |")
    for precision in args.precisions.split(","):
        torch.manual_seed(0)
        model = for_inference(GPT(model_preset("gpt1")), "cpu", precision)
        prepare_to_decode(model, None)
        prompt = torch.randint(0, 40000, (1, 32), generator=torch.Generator().manual_seed(1))
        pairs = precision == "bf16"
        rates: dict[str, list[float]] = {w: [] for w in WAYS}
        tokens: dict[str, list[int]] = {}
        rate(model, prompt)  # warm-up
        for r in range(args.rounds):
            for way in WAYS if r % 2 == 0 else reversed(WAYS):
                module.set_one_row_stream(pairs, WAYS[way])
                got, tokens[way] = rate(model, prompt)
                rates[way].append(got)
        backend.reset()  # the next use sets the timed choice again
        if tokens["a channel at a time"] != tokens["side by side"]:
            sys.exit(f"{precision}: the two readings chose different tokens")
        medians = [statistics.median(rates[w]) for w in WAYS]
        print(
            f"| {precision} | {medians[0]:.1f} | {medians[1]:.1f} | {medians[1] / medians[0]:.2f}x |"
        )


if __name__ == "__main__":
    main()
