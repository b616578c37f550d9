"""Batch-1 greedy generation of one system alone in this process: gpt1 in a precision, or
CTranslate2 on GPT-1's weights (the mapping of `benchmarks/inference.py`).

`benchmarks/inference.py` times gpt1 and its anchors alternating in one run, with CTranslate2
in a child process (while a CTranslate2 generator lives in a process, gpt1's decoding there
runs at about half speed; docs/results.md). This script gives each system a process of its own
and nothing else, to be run one after another:

    for s in gpt1:int8 ct2:int8 gpt1:fp32 ct2:float32 gpt1:bf16; do
        python benchmarks/generate_alone.py $s; done

GPT-1 size, random weights (the same seed as inference.py), 128 new tokens after 32, medians of
`--repeats` runs after one warm-up. gpt1's weights are gathered into one storage first, as a
server keeps them and a generation of `decoding.GATHER_FROM_TOKENS` tokens or more does
(`--as-loaded`: where they were loaded, as a shorter generation leaves them).
`benchmarks/tiers.py` runs it under each CPU tier's caps.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import (  # noqa: E402
    alternate,
    build_models,
    ct2_generate,
    ctranslate2_generator,
    decode_bytes,
    read_bandwidth,
)

from gpt1.inference.decoding import prepare_to_decode  # noqa: E402
from gpt1.inference.generate import generate_stream  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402
from gpt1.inference.sampling import Sampling  # noqa: E402


def measure(
    system: str, prompt_len: int, new: int, repeats: int, threads: int, as_loaded: bool = False
) -> dict:
    """`system` (gpt1:fp32|bf16|int8 or ct2:float32|int8) alone in this process: its median
    new tokens/s and, for gpt1, its decoding steps' median tokens/s (the time after the first
    token, which the prompt's forward pass takes up) and the bytes a step reads
    (`decode_bytes`)."""
    torch.set_num_threads(threads)
    kind, precision = system.split(":")
    torch.manual_seed(0)
    clf32, _, _ = build_models(40478 + 3)
    prompt = torch.randint(0, 40478, (1, prompt_len))
    found: dict = {"system": system}
    firsts: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "ct2":
            gen = ctranslate2_generator(clf32.gpt, Path(tmp), precision, threads)
            run = lambda: ct2_generate(gen, prompt, new)  # noqa: E731
        else:
            model = for_inference(copy.deepcopy(clf32), "cpu", precision).gpt
            if not as_loaded:  # as a server keeps them: a generation of 384+ tokens does too
                prepare_to_decode(model)
            # the cache a decoding step reads, on average over the generation's steps
            found["decode_bytes"] = decode_bytes(model, context=prompt_len + new // 2)
            run = lambda: firsts.append(first_token_time(model, prompt, new))  # noqa: E731
        with torch.inference_mode():
            times = alternate({system: run}, repeats)[system]
    found["tokens_per_s"] = new / statistics.median(times)
    if firsts:  # the decoding steps alone: the time after the first token (the prompt's)
        steps = [(new - 1) / (t - f) for t, f in zip(times, firsts[-len(times) :])]
        found["decode_tokens_per_s"] = statistics.median(steps)
        # the memory's read speed now, in this process: on a shared host it drifts by 10-20%
        # in minutes, so the bound is made of the bandwidth measured beside the rate
        found["bandwidth"] = read_bandwidth()
    return found


def first_token_time(model, prompt: torch.Tensor, new: int) -> float:
    """Greedy generation of `new` tokens after `prompt` (what `generate` runs); returns the
    seconds to the first token, which the prompt's forward pass takes up."""
    start = time.perf_counter()
    stream = generate_stream(model, prompt, Sampling(max_new_tokens=new, temperature=0.0))
    next(stream)
    first = time.perf_counter() - start
    for _ in stream:
        pass
    return first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("system", help="gpt1:fp32|bf16|int8 or ct2:float32|int8")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--json", action="store_true", help="print one JSON line (benchmarks/tiers.py)")
    p.add_argument(
        "--as-loaded",
        action="store_true",
        help="gpt1's weights where they were loaded, as a short generation leaves them",
    )
    args = p.parse_args()
    found = measure(
        args.system, args.prompt, args.new_tokens, args.repeats, args.threads, args.as_loaded
    )
    if args.json:
        print(json.dumps(found))
        return
    steps = found.get("decode_tokens_per_s")
    print(
        f"{args.system} alone: {found['tokens_per_s']:.1f} new tokens/s"
        + (f", decoding steps {steps:.1f} tokens/s" if steps else "")
        + f" ({args.threads} threads, {args.new_tokens} after {args.prompt}, median of "
        f"{args.repeats})"
    )


if __name__ == "__main__":
    main()
