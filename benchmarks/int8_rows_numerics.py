"""How far int8 with one activation scale per row lands from the other paths.

    python benchmarks/int8_rows_numerics.py

1. Products: GPT-1's five weight shapes, random weights (N(0, 0.02), as GPT-1 initialises) and
   64 rows of bf16 activations (N(0, 1), a few columns 20x larger, as LayerNorm outputs have):
   per-row int8 against the widening kernel's arithmetic (int8 weights, bf16 activations: the
   current path for a few rows), against one scale per tensor, and against fp32.
2. Logits: one decoding step of 16 sequences (32-token prompts) through a random GPT-1-size model
   and a random tiny one: the integer step (per-row int8) against the one-call step (the
   widening kernel) and against the fp32 model; the largest absolute difference, that
   difference relative to the largest fp32 logit, and how many greedy choices agree.
"""

from __future__ import annotations

import copy

import torch

from gpt1 import GPT
from gpt1.config import model_preset
from gpt1.inference import int8_rows
from gpt1.inference.decoding import SlotPool, decode, forward_cached
from gpt1.inference.prepared import for_inference
from gpt1.inference.quantize import PackedInt8, quantize_rows

SHAPES = {
    "attn.c_attn": (768, 2304),
    "attn.c_proj": (768, 768),
    "mlp.c_fc": (768, 3072),
    "mlp.c_proj": (3072, 768),
    "output layer": (768, 40478),
}


def _diff(got: torch.Tensor, want: torch.Tensor) -> str:
    d = (got.float() - want.float()).abs().max().item()
    return f"{d:.4f} ({d / want.float().abs().max().item():.2%})"


def products() -> None:
    print(
        "| product | per row vs widening | per row vs per tensor | per row vs fp32 | widening vs fp32 |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    g = torch.Generator().manual_seed(0)
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, generator=g) * 0.02
        x = torch.randn(64, k, generator=g)
        x[:, torch.randint(0, k, (4,), generator=g)] *= 20
        x = x.bfloat16()
        q, scale = quantize_rows(w)
        widening = (x.float() @ q.float().t() * scale).bfloat16()  # fp32 sums of bf16 x int8
        row = int8_rows.reference(x, q, scale, None)
        packed = PackedInt8()
        amax = x.float().abs().max().item()
        qx = torch.round(x.float() * (127 / amax)).to(torch.int8)
        tensor = packed.product(qx, amax / 127, q, scale, None, torch.bfloat16, "s8")
        fp32 = x.float() @ w.t()
        cells = [_diff(row, widening), _diff(row, tensor), _diff(row, fp32), _diff(widening, fp32)]
        print(f"| {name} {k}->{n} | " + " | ".join(cells) + " |")


def logits(preset: str, vocab: int) -> None:
    torch.manual_seed(0)
    fp32 = GPT(model_preset(preset).derive(vocab_size=vocab)).eval()
    int8 = for_inference(copy.deepcopy(fp32), "cpu", "int8")
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, vocab, (16, 32), generator=g)
    ids = torch.randint(0, vocab, (16,), generator=g)
    found = {}
    with torch.no_grad():
        for name, model in (("fp32", fp32), ("int8", int8)):
            pool = SlotPool(model.config.n_layer, 64)
            caches = [pool.cache() for _ in range(16)]
            for p, cache in zip(prompts, caches):
                forward_cached(model, p[None], cache)
            for one_call in (True, False) if name == "int8" else (True,):
                with int8_rows.per_row(not one_call):
                    hidden = decode(model, ids, caches, one_call=one_call)
                    found[(name, one_call)] = model.lm_logits(hidden).float()
                for cache in caches:
                    cache.truncate(32)
    row, widening, ref = found[("int8", False)], found[("int8", True)], found[("fp32", True)]
    agree = lambda a, b: int((a.argmax(-1) == b.argmax(-1)).sum())  # noqa: E731
    print(
        f"| {preset} | {_diff(row, widening)} | {_diff(row, ref)} | {_diff(widening, ref)} | "
        f"{agree(row, widening)}/16, {agree(row, ref)}/16, {agree(widening, ref)}/16 |"
    )


def main() -> None:
    torch.set_num_threads(2)
    products()
    print()
    print("| model | integer vs one-call step | integer vs fp32 | one-call vs fp32 | same argmax |")
    print("| --- | ---: | ---: | ---: | ---: |")
    logits("gpt1", 40478)
    logits("tiny", 512)


if __name__ == "__main__":
    main()
