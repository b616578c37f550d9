"""How far int8 with one activation scale per row lands from the other paths, in both of the
forms a row is quantised in (`int8_rows.FORMS`: "s8", signed 8-bit, with VNNI, AMX and oneDNN;
"u7", unsigned 7-bit with a zero point, gpt1's AVX2 kernel).

    python benchmarks/int8_rows_numerics.py
    python benchmarks/int8_rows_numerics.py --checkpoint RUN --text BOOK.txt   # and a trained model

1. Products: GPT-1's five weight shapes, random weights (N(0, 0.02), as GPT-1 initialises) and
   64 rows of bf16 activations (N(0, 1), a few columns 20x larger, as LayerNorm outputs have):
   per-row int8 (s8, and u7 against fp32) against the widening kernel's arithmetic (int8
   weights, bf16 activations: the path for one row), against one scale per tensor, and against
   fp32.
2. Logits: one decoding step of 16 sequences (32-token prompts) through a random GPT-1-size model
   and a random tiny one: the integer step (per-row int8 in this build's form) against the
   one-call step (the widening kernel) and against the fp32 model; the largest absolute
   difference, that difference relative to the largest fp32 logit, and how many greedy choices
   agree.
3. With `--checkpoint` and `--text`: a trained model reads windows of the text whole, every
   product (the output layer's too) as fp32, as int8 weights times float activations
   (widening), and as per-row int8 in each form, in plain torch (`int8_rows.reference`):
   next-token loss, and how often each one's most likely next token is fp32's. Also "u6", a
   form no kernel takes: 63 steps a row, which would let the AVX2 kernel add two `vpmaddubsw`
   results in 16 bits before widening them (a third more multiply-adds a cycle), emulated in
   float64. Also the u7 form with the keys and values every position attends to rounded as a
   cache would store them: bf16, int8 with one scale per position and head (symmetric: no
   cache stores these), and int8 as the int8 cache stores them (`decoding.quantize_cache_rows`: a
   scale and a bias per position and head).
4. With them too: the same windows decoded as `BatchedDecoder` decodes them, every window a
   sequence of one pool, a prompt of `PROMPT` tokens then one token a step through the many-row
   integer step (the compiled one, in this build's form), the next token of every position
   predicted (teacher forcing): with the keys and values cached in the activations' dtype, in
   bf16, and in int8 as `BatchedDecoder` caches them (`int8_step.cache_dtype`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import gpt1.model.gpt as gpt_module
from gpt1 import GPT, load_checkpoint
from gpt1.config import model_preset
from gpt1.inference import backend, int8_rows, int8_step
from gpt1.inference.decoding import (
    SlotPool,
    decode,
    dequantize_cache_rows,
    forward_cached,
    quantize_cache_rows,
)
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
        "| product | per row vs widening | per row vs per tensor | per row vs fp32 "
        "| u7 per row vs fp32 | widening vs fp32 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    g = torch.Generator().manual_seed(0)
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, generator=g) * 0.02
        x = torch.randn(64, k, generator=g)
        x[:, torch.randint(0, k, (4,), generator=g)] *= 20
        x = x.bfloat16()
        q, scale = quantize_rows(w)
        widening = (x.float() @ q.float().t() * scale).bfloat16()  # fp32 sums of bf16 x int8
        row = int8_rows.reference(x, q, scale, None)
        row_u7 = int8_rows.reference(x, q, scale, None, "u7")
        packed = PackedInt8()
        amax = x.float().abs().max().item()
        qx = torch.round(x.float() * (127 / amax)).to(torch.int8)
        tensor = packed.product(qx, amax / 127, q, scale, None, torch.bfloat16, "s8")
        fp32 = x.float() @ w.t()
        cells = [_diff(row, widening), _diff(row, tensor), _diff(row, fp32), _diff(row_u7, fp32)]
        cells.append(_diff(widening, fp32))
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
            pool = SlotPool(model.config.n_layer, 64, int8_step.cache_dtype(model))
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


class _EmulatedLinear(nn.Module):
    """x @ w.T + b with int8 per-channel weights, the activations as `form` says: None keeps them
    float (the widening kernel's arithmetic, in fp32 here), else per-row int8 in that form."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, form: str | None):
        super().__init__()
        self.q, self.scale = quantize_rows(weight)
        self.bias, self.form = bias, form

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form == "u6":
            return _u6_product(x, self.q, self.scale, self.bias)
        if self.form is not None:
            return int8_rows.reference(x.float(), self.q, self.scale, self.bias, self.form)
        out = x.float() @ (self.q.float() * self.scale[:, None]).t()
        return out if self.bias is None else out + self.bias


def _u6_product(
    x: torch.Tensor, q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The per-row product with each row's range [min(x, 0), max(x, 0)] in 63 steps (the u7
    form's arithmetic with one bit fewer), in float64."""
    rows = x.reshape(-1, x.shape[-1]).double()
    low = rows.amin(dim=1, keepdim=True).clamp(max=0.0)
    high = rows.amax(dim=1, keepdim=True).clamp(min=0.0)
    scale = torch.where(high > low, (high - low) / 63.0, torch.ones_like(high))
    zero = torch.round(-low / scale)
    steps = (torch.round(rows / scale) + zero).clamp(0.0, 63.0) - zero
    out = (steps * scale) @ (q.double() * w_scale.double()[:, None]).t()
    out = out if bias is None else out + bias.double()
    return out.float().view(*x.shape[:-1], q.shape[0])


def _emulated(model: GPT, form: str | None) -> GPT:
    """A copy of `model` whose every Linear is `_EmulatedLinear`, with the output layer's."""
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, _EmulatedLinear(child.weight, child.bias, form))
    model.output_layer = _EmulatedLinear(model.wte.weight, None, form)
    return model


def _int8_symmetric(x: torch.Tensor) -> torch.Tensor:
    """Each position's D numbers (the last dimension) as int8 times one scale, back in fp32."""
    scale = x.abs().amax(-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny) / 127
    return torch.round(x / scale).clamp(-127, 127) * scale


KEPT_AS = {
    "bf16": lambda x: x.to(torch.bfloat16).float(),
    "int8, symmetric": _int8_symmetric,
    "int8 as the int8 cache stores them": lambda x: dequantize_cache_rows(
        quantize_cache_rows(x), x.dtype
    ),
}


@contextlib.contextmanager
def _keys_and_values(rounded):
    """Every attention call of `GPT`'s blocks sees its keys and values as `rounded` gives them."""
    real = gpt_module.attention
    gpt_module.attention = lambda q, k, v, **kw: real(q, rounded(k), rounded(v), **kw)
    try:
        yield
    finally:
        gpt_module.attention = real


def trained(checkpoint: Path, text: Path, windows: int) -> None:
    from gpt1.text.tokenizer import Tokenizer

    fp32 = load_checkpoint(checkpoint).eval()
    ids = torch.tensor(Tokenizer.from_dir(checkpoint).encode(text.read_text(encoding="utf-8")))
    width = fp32.config.n_positions
    count = min(windows, len(ids) // width)
    if count == 0:
        raise SystemExit(f"{text}: fewer than {width} tokens, the model's window")
    batch = ids[: count * width].view(count, width)
    print(f"{checkpoint.name}: {count} windows of {width} tokens of {text.name}")
    print()
    print("| products | next-token loss | top-1 as fp32's |")
    print("| --- | ---: | ---: |")
    with torch.no_grad():
        want = fp32.lm_logits(fp32(batch)).float()
        for label, form in (
            ("fp32", "fp32"),
            ("widening", None),
            ("s8 per row", "s8"),
            ("u7 per row", "u7"),
            ("u6 per row (no kernel's)", "u6"),
        ):
            if form == "fp32":
                got = want
            else:
                model = _emulated(fp32, form)
                got = model.output_layer(model(batch))
            _row(label, got, want, batch)
        model = _emulated(fp32, "u7")
        for kept, rounded in KEPT_AS.items():
            with _keys_and_values(rounded):
                got = model.output_layer(model(batch))
            _row(f"u7 per row, keys and values as {kept}", got, want, batch)
    decoded(fp32, batch)


def _row(label: str, got: torch.Tensor, want: torch.Tensor, batch: torch.Tensor) -> None:
    loss = F.cross_entropy(got[:, :-1].flatten(0, 1), batch[:, 1:].flatten())
    same = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    print(f"| {label} | {loss.item():.4f} | {same:.2%} |")


PROMPT = 16  # tokens of each window read as its prompt before the steps


def decoded(fp32: GPT, batch: torch.Tensor) -> None:
    """Section 4: `batch` [windows, T] decoded token by token through the integer step."""
    model = for_inference(copy.deepcopy(fp32), "cpu", "int8")
    with torch.no_grad():
        want = fp32.lm_logits(fp32(batch)).float()[:, PROMPT - 1 : -1]
    stored = [None]  # the activations' dtype; then the narrower ones the compiled step reads
    if int8_step.cache_dtype(model) is not None:
        stored += [d for d in (torch.bfloat16, torch.int8) if d != model.wte.weight.dtype]
    print()
    print(
        f"Decoded as BatchedDecoder decodes: {batch.shape[0]} sequences, {PROMPT}-token prompts,"
        f" {batch.shape[1] - PROMPT} steps ({model.wte.weight.dtype} activations)"
    )
    print()
    print("| keys and values cached in | next-token loss | top-1 as fp32's |")
    print("| --- | ---: | ---: |")
    for dtype in stored:
        pool = SlotPool(model.config.n_layer, model.config.n_positions, dtype)
        caches = [pool.cache() for _ in range(batch.shape[0])]
        with torch.no_grad(), int8_rows.per_row():
            last = [
                forward_cached(model, row[None, :PROMPT], c)[0, -1] for row, c in zip(batch, caches)
            ]
            got = [model.lm_logits(torch.stack(last)).float()]
            for t in range(PROMPT, batch.shape[1] - 1):
                hidden = decode(model, batch[:, t], caches, one_call=False)
                got.append(model.lm_logits(hidden).float())
        logits = torch.stack(got, 1)
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, PROMPT:].flatten())
        same = (logits.argmax(-1) == want.argmax(-1)).float().mean().item()
        name = str(dtype or model.wte.weight.dtype).removeprefix("torch.")
        print(f"| {name} | {loss.item():.4f} | {same:.2%} |")
    loss = F.cross_entropy(want.flatten(0, 1), batch[:, PROMPT:].flatten())
    print(f"| (the fp32 model) | {loss.item():.4f} | - |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, help="a trained gpt1 checkpoint folder")
    parser.add_argument("--text", type=Path, help="text the checkpoint did not train on")
    parser.add_argument("--windows", type=int, default=40, help="windows of --text to read")
    args = parser.parse_args()
    if (args.checkpoint is None) != (args.text is None):
        parser.error("--checkpoint and --text go together")
    torch.set_num_threads(2)
    products()
    print()
    print(f"The integer step's rows: {backend.own_int8_form()} (this build)")
    print()
    print("| model | integer vs one-call step | integer vs fp32 | one-call vs fp32 | same argmax |")
    print("| --- | ---: | ---: | ---: | ---: |")
    logits("gpt1", 40478)
    logits("tiny", 512)
    if args.checkpoint is not None:
        print()
        trained(args.checkpoint, args.text, args.windows)


if __name__ == "__main__":
    main()
