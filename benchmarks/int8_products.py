"""int8 products of many rows, GPT-1's layer shapes: oneDNN's int8 kernel against the float path.

For each weight shape of a GPT-1 block and the tied output layer, on `--rows` rows of bf16
activations (800: a batch of 32 SST-2 sentences of about 25 tokens; the output layer: a
perplexity batch), the median time of one product:

* int8 per tensor: `quantize.int8_linear` with a `PackedInt8` -- what `--precision int8` runs
  (activations quantised with one scale per tensor, oneDNN's int8 kernel, bias in the kernel);
* int8 kernel alone: the same product on activations already quantised (what quantising them
  costs is the difference);
* int8 per row: the same kernel with one activation scale per row, written out here (the row
  scales go on the output in another pass, and the bias with them);
* int8 float path: the int8 values multiplied as bf16 and the scales applied after
  (`GPT1_INT8_MATMUL=0`, and where oneDNN's kernel is missing);
* bf16: the bf16 weight through `prepack.PackedWeight`, what `--precision bf16` runs.

The systems alternate within each repeat. Weights and activations are random (the speed does
not depend on their values).

    python benchmarks/int8_products.py
    python benchmarks/int8_products.py --rows 2048 --repeats 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpt1.inference import backend, quantize  # noqa: E402
from gpt1.inference.prepack import PackedWeight  # noqa: E402

# (name, in, out) for GPT-1: n_embd 768, 3072 inner, 40478 + 3 tokens.
SHAPES = [
    ("attn.c_attn", 768, 2304),
    ("attn.c_proj", 768, 768),
    ("mlp.c_fc", 768, 3072),
    ("mlp.c_proj", 3072, 768),
    ("output layer", 768, 40481),
]


def per_row(x, lin: quantize.Int8Linear) -> torch.Tensor:
    """oneDNN's int8 kernel with one activation scale per row."""
    amax = x.abs().amax(dim=1, keepdim=True).float().clamp_min_(1e-30)
    qx = torch.mul(x, 127.0 / amax).round_().to(torch.int8)
    packed, zero_points = lin._packed.packed(lin.qweight)
    out = torch.ops.onednn.qlinear_pointwise(
        qx, 1.0, 0, packed, lin.scale, zero_points,
        None, 1.0, 0, x.dtype, "none", [], "",
    )  # fmt: skip
    row_scales = (amax / 127.0).to(x.dtype)
    return out.mul_(row_scales) if lin.bias is None else torch.addcmul(lin.bias, out, row_scales)


def kernel_alone(qx: torch.Tensor, x_scale: float, lin: quantize.Int8Linear) -> torch.Tensor:
    """oneDNN's int8 product of activations already quantised (`qx` int8, one scale)."""
    packed, zero_points = lin._packed.packed(lin.qweight)
    return torch.ops.onednn.qlinear_pointwise(
        qx, x_scale, 0, packed, lin.scale, zero_points,
        lin.bias, 1.0, 0, torch.bfloat16, "none", [], "",
    )  # fmt: skip


def systems_for(k: int, n: int, rows: int, bias: bool) -> dict:
    torch.manual_seed(0)
    linear = nn.Linear(k, n, bias=bias)
    nn.init.normal_(linear.weight, std=0.02)
    lin = quantize.Int8Linear(linear, torch.bfloat16)
    x = torch.randn(rows, k).bfloat16()
    bf16 = PackedWeight()
    w, b = linear.weight.detach().bfloat16(), lin.bias
    qx, x_scale = quantize._quantize_per_tensor(x)
    return {
        "int8 per tensor": lambda: quantize.int8_linear(x, lin.qweight, lin.scale, b, lin._packed),
        "int8 kernel alone": lambda: kernel_alone(qx, x_scale, lin),
        "int8 per row": lambda: per_row(x, lin),
        "int8 float path": lambda: quantize._dequantised_linear(x, lin.qweight, lin.scale, b),
        "bf16": lambda: bf16.linear(x, w, b),
    }


def median_ms(systems: dict, repeats: int) -> dict[str, float]:
    for fn in systems.values():  # warm up: packs the weights
        fn()
    times = {name: [] for name in systems}
    for _ in range(repeats):
        for name, fn in systems.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) * 1e3 for name, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=800)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    if not backend.onednn_has_int8():
        raise SystemExit("this torch build has no oneDNN int8 linear kernel")
    print(f"{args.rows} rows, bf16 activations, {torch.get_num_threads()} threads, ms per product")
    names = None
    with torch.inference_mode():
        for layer, k, n in SHAPES:
            bias = layer != "output layer"  # the tied output layer has none
            ms = median_ms(systems_for(k, n, args.rows, bias), args.repeats)
            if names is None:
                names = list(ms)
                print(f"{'layer':22s}" + "".join(f"{name:>19s}" for name in names))
            print(f"{layer:12s} {k:4d}->{n:<5d}" + "".join(f"{ms[name]:19.3f}" for name in names))


if __name__ == "__main__":
    main()
