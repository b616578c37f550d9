"""Batch-1 greedy generation of one system alone in this process: gpt1 in a precision, or
CTranslate2 on GPT-1's weights (the mapping of `benchmarks/inference.py`).

`benchmarks/inference.py` times gpt1 and its anchors alternating in one run, with CTranslate2
in a child process (while a CTranslate2 generator lives in a process, gpt1's decoding there
runs at about half speed; docs/results.md). This script gives each system a process of its own
and nothing else, to be run one after another:

    for s in gpt1:int8 ct2:int8 gpt1:fp32 ct2:float32 gpt1:bf16; do
        python benchmarks/generate_alone.py $s; done

GPT-1 size, random weights (the same seed as inference.py), 128 new tokens after 32, medians of
`--repeats` runs after one warm-up.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import alternate, build_models, ct2_generate, ctranslate2_generator  # noqa: E402

from gpt1.model.inference import for_inference  # noqa: E402
from gpt1.recipes.sample import generate  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("system", help="gpt1:fp32|bf16|int8 or ct2:float32|int8")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kind, precision = args.system.split(":")
    torch.manual_seed(0)
    clf32, _, _ = build_models(40478 + 3)
    prompt = torch.randint(0, 40478, (1, args.prompt))
    new = args.new_tokens
    tmp = tempfile.TemporaryDirectory()
    if kind == "ct2":
        gen = ctranslate2_generator(clf32.gpt, Path(tmp.name), precision, args.threads)
        run = lambda: ct2_generate(gen, prompt, new)  # noqa: E731
    else:
        model = for_inference(copy.deepcopy(clf32), "cpu", precision).gpt
        run = lambda: generate(model, prompt, new, temperature=0)  # noqa: E731
    with torch.inference_mode():
        times = alternate({args.system: run}, args.repeats)[args.system]
    print(
        f"{args.system} alone: {new / statistics.median(times):.1f} new tokens/s "
        f"({args.threads} threads, {new} after {args.prompt}, median of {args.repeats})"
    )
    tmp.cleanup()


if __name__ == "__main__":
    main()
