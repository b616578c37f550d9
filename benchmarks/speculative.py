"""Speculative decoding with drafts from the text (`gpt1.inference.speculative`) against plain
greedy decoding: tokens/s side by side, whether the tokens are identical, drafts accepted.

Two texts from a Gutenberg novel in the shared corpus (or `--text`): "copy" (a paragraph of 80-160
tokens, a paragraph break and its first 8 tokens again: a model that has learned to copy continues the passage, and
all 64 new tokens fall within it) and "prose" (the first 40 tokens of another paragraph,
continued). Decoding speed counts the new tokens after the
first (the prompt's pass is the same on both sides); plain and speculative alternate, medians of
`--rounds` rounds of `--paragraphs` paragraphs each, after one warm-up generation each way.
For each text it also counts the new tokens that end a run of 4 tokens found in the prompt (the
model copying it) and the others that repeat one of the last 15 new tokens (the model looping,
which drafts from the text predict too): a speed-up on "copy" means copying only where the first
share is high.

Two parts:
- `--checkpoint RUN`: the whole comparison, on a trained checkpoint in `--precision` (drafts are
  accepted only where the model predicts the passage: random weights do not copy);
- `--gpt1-cost`: GPT-1 size, random weights (speed does not depend on the weights), in
  `--precision`: the time of a plain decoding step and of a verifying pass of k = 1..7 drafts;
  plain against speculative decoding there (random weights' greedy text repeats one token:
  every draft is accepted, the ceiling); and the checkpoint's drafts paced as at GPT-1's size
  (`Untimed`) with the speed-up its steps (which were plain, which verified how many drafts)
  would have at GPT-1's size.

    python benchmarks/speculative.py --gpt1-cost --precision int8 --threads 1 --clock cpu
    python benchmarks/speculative.py --checkpoint runs/mine --gpt1-cost --threads 1 --clock cpu
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
from gpt1.inference import speculative  # noqa: E402
from gpt1.inference.decoding import KVCache, forward_cached, prepare_to_decode  # noqa: E402
from gpt1.inference.generate import choose, generate_stream  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402
from gpt1.inference.sampling import Sampling  # noqa: E402
from gpt1.inference.speculative import MAX_DRAFT, Costs, Drafts, Speculator, accept  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402

NOVEL = Path(__file__).resolve().parents[2] / "shared/data/corpus/gutenberg/1342-0.txt"
GREEDY = Sampling(max_new_tokens=64, temperature=0.0)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's CPU time
clock = CLOCKS["wall"]
RUN = 4  # tokens: a new token ending a run of this many found in the prompt continues it
LOOP = 15  # tokens back: a new token equal to one this near in the new text repeats it


class Traced(Speculator):
    """A speculator that records each step: 0 for a plain one, k for a pass verifying k drafts."""

    def __init__(self, tokens: list[int], counts: Drafts, trace: list[int]) -> None:
        super().__init__(tokens, counts)
        self.trace = trace

    def step(self, model, cache, last, sampling, generator, room, vocab=None):
        before = self.counts.drafted
        tokens = super().step(model, cache, last, sampling, generator, room, vocab)
        self.trace.append(self.counts.drafted - before if tokens is not None else 0)
        return tokens


def paragraphs(tokenizer, n: int, path: Path = NOVEL) -> tuple[list[list[int]], list[list[int]]]:
    """(copy prompts, prose prompts), n of each, from the paragraphs of the text at `path` (from
    a quarter of the way in): a copy prompt is a paragraph of 80-160 tokens, a paragraph break
    and the paragraph's first 8 tokens again, so that all 64 new tokens continue the passage a second time; a prose prompt
    is the first 40 tokens of a paragraph of 40-56."""
    text = path.read_text(encoding="utf-8")
    copy, prose = [], []
    gap = list(tokenizer.encode("\n\n"))  # between the passage and its repetition
    for para in text[len(text) // 4 :].split("\n\n"):
        ids = list(tokenizer.encode(" ".join(para.split())))
        if 80 <= len(ids) <= 160 and len(copy) < n:
            copy.append(ids + gap + ids[:8])
        elif 40 <= len(ids) <= 56 and len(prose) < n:
            prose.append(ids[:40])
        if len(copy) == len(prose) == n:
            break
    return copy, prose


def copied_and_looped(prompts: list[list[int]], outputs: list[list[int]]) -> tuple[int, int, int]:
    """(new tokens that end a run of RUN tokens found in their prompt, other new tokens equal
    to one at most LOOP tokens back in the new text, all new tokens): how much of a
    continuation copies the prompt, and how much is the model repeating itself, which drafts
    from the text predict as well."""
    copied = looped = total = 0
    for prompt, new in zip(prompts, outputs, strict=True):
        runs = {tuple(prompt[i : i + RUN]) for i in range(len(prompt) - RUN + 1)}
        text = prompt[-(RUN - 1) :] + new
        for i, token in enumerate(new):
            if tuple(text[i : i + RUN]) in runs:
                copied += 1
            elif any(new[i - d] == token for d in range(1, min(i, LOOP) + 1)):
                looped += 1
        total += len(new)
    return copied, looped, total


def decode(model, prompt: list[int], speculate: bool, out: dict) -> tuple[list[int], float]:
    """Greedy tokens of `prompt` and the seconds after the first one."""
    spec = Traced(prompt, out["drafts"], out["trace"]) if speculate else None
    steps = generate_stream(model, torch.tensor([prompt]), GREEDY, speculator=spec)
    got = [int(next(steps))]
    start = clock()
    got += [int(t) for t in steps]
    return got, clock() - start


def compare(model, prompts: list[list[int]], rounds: int) -> dict:
    """Plain and speculative decoding of every prompt, alternating, `rounds` times."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    for speculate in (False, True):  # warm-up: kernels, caches, first touches
        decode(model, prompts[0], speculate, {"drafts": Drafts(), "trace": []})
    first: dict = {"drafts": Drafts(), "trace": []}  # the first round's tokens, drafts, steps
    for r in range(rounds):
        for speculate in (False, True) if r % 2 == 0 else (True, False):
            out = first if r == 0 else {"drafts": Drafts(), "trace": []}
            runs = [decode(model, p, speculate, out) for p in prompts]
            rates[speculate].append(sum(len(t) - 1 for t, _ in runs) / sum(s for _, s in runs))
            if speculate and r == 0:
                first["tokens"] = [t for t, _ in runs]
            elif r == 0:
                first["plain_tokens"] = [t for t, _ in runs]
    same = first["tokens"] == first["plain_tokens"]
    plain, spec = statistics.median(rates[False]), statistics.median(rates[True])
    return {**first, "plain": plain, "spec": spec, "same": same}


def step_costs(model: GPT, rounds: int) -> dict[int, float]:
    """Seconds of a plain step (k = 0) and of a pass verifying k drafts, at 200 cached
    positions (medians)."""
    ids = torch.randint(0, 40000, (1, 208), generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.config.n_layer, model.config.n_positions)
    times: dict[int, list[float]] = {k: [] for k in range(MAX_DRAFT + 1)}
    with torch.no_grad():
        forward_cached(model, ids[:, :200], cache)
        for _ in range(rounds):
            for k in times:
                new, draft = ids[:, 200 : 201 + k], ids[0, 201 : 201 + k].tolist()
                start = clock()
                logits = model.lm_logits(forward_cached(model, new, cache)[0]).float()
                choose(logits[-1:], GREEDY, None) if k == 0 else accept(logits, draft, GREEDY, None)
                times[k].append(clock() - start)
                cache.truncate(200)
    return {k: statistics.median(v) for k, v in times.items()}


def projected(costs: dict[int, float], trace: list[int], tokens: int) -> float:
    """The speed-up at GPT-1's size of runs whose steps after the prompt's were `trace` (0:
    plain, k: a pass verifying k drafts), making `tokens` tokens: plain decoding takes a plain
    step for each."""
    return tokens * costs[0] / sum(costs[k] for k in trace)


def gpt1_size(rounds: int, precision: str) -> dict[int, float]:
    """GPT-1 size, random weights, in `precision`: the pass costs, and plain against speculative decoding
    of 64 tokens after random prompts, a text whose greedy continuation repeats one token (so
    every draft is accepted: the ceiling of the speed-up)."""
    torch.manual_seed(0)
    model = for_inference(GPT(model_preset("gpt1")), "cpu", precision)
    prepare_to_decode(model, None)
    costs = step_costs(model, rounds)
    print(f"GPT-1 size, {precision}, random weights: ms per pass at 200 cached positions")
    print("  " + "  ".join(f"k={k}: {s * 1e3:.1f}" for k, s in costs.items()))
    prompts = torch.randint(0, 40000, (2, 100), generator=torch.Generator().manual_seed(1))
    r = compare(model, prompts.tolist(), rounds)
    print(
        f"  random prompts, greedy: plain {r['plain']:.2f} tok/s, speculative {r['spec']:.2f}"
        f" tok/s ({r['spec'] / r['plain']:.2f}x), identical: {'yes' if r['same'] else 'no'},"
        f" {r['drafts']}"
    )
    return costs


class Untimed(Costs):
    """Passes judged by acceptance alone, as at GPT-1's size, where a pass of up to 7 drafts
    costs well under two plain steps (`gpt1_size`), so every pass that accepts a draft pays."""

    def plain_step(self, seconds: float) -> None:
        pass


def at_gpt1_size(model, prompts: list[list[int]], costs: dict[int, float]) -> str:
    """This model's drafts paced as at GPT-1's size (`Untimed`), and the speed-up its steps
    would have there: GPT-1's plain step for each token, against its step and pass costs."""
    out: dict = {"drafts": Drafts(), "trace": []}
    original = speculative.costs_of
    speculative.costs_of = lambda model: Untimed()
    try:
        tokens = sum(len(decode(model, p, True, out)[0]) - 1 for p in prompts)
    finally:
        speculative.costs_of = original
    return f"{out['drafts']}, {projected(costs, out['trace'], tokens):.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a trained checkpoint (its tokenizer encodes the text)")
    ap.add_argument("--gpt1-cost", action="store_true", help="step costs at GPT-1 size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--paragraphs", type=int, default=4)
    ap.add_argument("--text", type=Path, default=NOVEL, help="the text (default: a novel)")
    ap.add_argument("--clock", choices=CLOCKS, default="wall", help="cpu: this process's time")
    ap.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    costs = gpt1_size(args.rounds, args.precision) if args.gpt1_cost else None
    if not args.checkpoint:
        return
    from gpt1.inference.loading import load_for_inference

    loaded = load_for_inference(args.checkpoint, "cpu", args.precision)
    prepare_to_decode(loaded.lm, None)
    copy, prose = paragraphs(loaded.tokenizer, args.paragraphs, args.text)
    print(
        f"{args.checkpoint}: {args.precision}, greedy, 64 new tokens, {args.threads} threads,"
        f" {args.clock} clock"
    )
    print(
        "| text | plain tok/s | speculative tok/s | speed-up | identical | drafts accepted |"
        f" new tokens copying the prompt / repeating the new text (runs of {RUN}, {LOOP} back) |"
        + (" at GPT-1 size: drafts accepted, speed-up (projected) |" if costs else "")
    )
    for name, prompts in (("copy", copy), ("prose", prose)):
        r = compare(loaded.lm, prompts, args.rounds)
        copied, looped, total = copied_and_looped(prompts, r["plain_tokens"])
        line = (
            f"| {name} | {r['plain']:.1f} | {r['spec']:.1f} | {r['spec'] / r['plain']:.2f}x"
            f" | {'yes' if r['same'] else 'no'} | {r['drafts']} |"
            f" {copied} ({copied / total:.0%}) / {looped} ({looped / total:.0%}) of {total} |"
        )
        if costs:
            line += f" {at_gpt1_size(loaded.lm, prompts, costs)} |"
        print(line)


if __name__ == "__main__":
    main()
