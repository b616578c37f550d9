"""How fast gpt1's exact int8 kernel multiplies, against a saturating int8 kernel and the float
products, in one process, on this CPU or under a tier's caps (`benchmarks/tiers.py`).

gpt1's int8 kernel (`kernels/int8_rows.cpp`, one activation scale per row) sums exactly: with
AVX-512 VNNI or AMX on signed 8-bit activations at no cost. On AVX2 `vpmaddubsw`'s 16-bit pair
sums would saturate on (x + 128) * w, and keeping 8-bit activations exact costs a sign step per
product (8 vector operations per 64 multiply-adds of a row), so the AVX2 kernel quantises each
row to unsigned 7-bit numbers with a zero point ("u7", `int8_rows.quantize_u7`): 6 operations,
as a saturating kernel (MKL's or oneDNN's AVX2 int8, which CTranslate2 runs) issues, and still
the exact sums of its integers. Printed:

* arithmetic rates in multiply-adds/s: gpt1's kernel on 256 rows through a 768 x 768 weight that
  stays in L2 (its arithmetic alone), oneDNN's int8 product (unsigned activations: its AVX2 form
  saturates, `backend.onednn_int8_exact`) and the fp32 matrix product, 2048^3 each;
* gpt1's kernel against the float path an int8 layer would otherwise take (the int8 values as
  fp32, or as bf16, times the activations, the scales after: `quantize._dequantised_linear`) at
  16 to 2048 rows, for GPT-1's 768 -> 3072 layer and its 768 -> 40478 output layer.

With `--step`, also the integer decoding step's 12 blocks at GPT-1 size (random weights, each
sequence 64 positions cached) for 2 to 64 rows, its int8 products on gpt1's kernel against
oneDNN's (where oneDNN's sums are exact): what `kernels/int8_rows.cpp`'s choice of rows rests on.

Best of `--repeats`, each process's CPU time, `--threads` threads (1: one core's figures).

    python benchmarks/int8_arithmetic.py                 # this CPU
    python benchmarks/int8_arithmetic.py --tier avx2     # a laptop's AVX2 + FMA, simulated
    python benchmarks/int8_arithmetic.py --step          # and the step's blocks, both kernels
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiers import TIERS, enter_tier  # noqa: E402


def best(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def rates(kernels, repeats: int) -> None:
    from gpt1.inference import backend

    k = n = 768
    m = 256
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    packed, x = kernels.pack_vnni(q), torch.randn(m, k)
    took = best(lambda: kernels.rows_product(x, packed, torch.ones(n), None, n), repeats)
    form = kernels.int8_rows_form()
    print(
        f"gpt1's int8 kernel ({form} rows), {m} x {k} x {n} (weights in L2): "
        f"{m * k * n / took / 1e9:.1f} G/s"
    )
    size = 2048
    a = torch.randint(-127, 128, (size, size), dtype=torch.int8)
    b = torch.randint(-127, 128, (size, size), dtype=torch.int8)
    if backend.onednn_has_int8():
        copy = backend.pack_int8(b)
        took = best(
            lambda: backend.onednn_int8_product(
                a, 1.0, copy, torch.ones(size), None, torch.float32, "u8"
            ),
            repeats,
        )
        exact = "exact" if backend.onednn_int8_exact("u8") else "saturating"
        print(f"oneDNN's int8 product ({exact}), {size}^3: {size**3 / took / 1e9:.1f} G/s")
    af, bf = a.float(), b.float()
    took = best(lambda: af @ bf, repeats)
    print(f"fp32 matrix product, {size}^3: {size**3 / took / 1e9:.1f} G/s")


def against_float(kernels, repeats: int) -> None:
    from gpt1.inference import quantize

    print("\n| layer | rows | gpt1's kernel ms | fp32 float path ms | bf16 float path ms |")
    print("|---|---:|---:|---:|---:|")
    for k, n in ((768, 3072), (768, 40478)):
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        scale = torch.rand(n) / 100
        packed = kernels.pack_vnni(q)
        for m in (16, 64, 256, 2048):
            if n * m > 3072 * 2048:
                continue  # the output layer at many rows: minutes on one core
            x = torch.randn(m, k)
            own = best(lambda: kernels.rows_product(x, packed, scale, None, n), repeats)
            fp32 = best(lambda: quantize._dequantised_linear(x, q, scale, None), repeats)
            bf16 = "-"
            if m <= 64:
                xb = x.bfloat16()
                took = best(lambda: quantize._dequantised_linear(xb, q, scale, None), repeats)
                bf16 = f"{took * 1e3:.1f}"
            print(f"| {k} -> {n} | {m} | {own * 1e3:.1f} | {fp32 * 1e3:.1f} | {bf16} |")


def step_kernels(repeats: int) -> None:
    from step_profile import filled_pool

    from gpt1 import GPT
    from gpt1.config import model_preset
    from gpt1.inference import backend, int8_rows, int8_step
    from gpt1.inference.decoding import decode
    from gpt1.inference.prepared import for_inference

    if backend.int8_many_rows() is None:
        print("\noneDNN's int8 kernel is not exact (or not here): the step has one kernel")
        return
    torch.manual_seed(0)
    model = for_inference(GPT(model_preset("gpt1").derive(vocab_size=40478)), "cpu", "int8")
    caches = filled_pool(model, 64, 64, int8_step.cache_dtype(model))
    own = backend.few_rows_int8

    def blocks(rows: int, gpt1s: bool) -> float:
        backend.few_rows_int8 = own if gpt1s else (lambda: False)  # no copy: oneDNN's
        ids, picked = torch.randint(0, 40478, (rows,)), caches[:rows]

        def run() -> None:
            decode(model, ids, picked, one_call=False)
            for cache in picked:
                cache.truncate(64)

        try:
            with torch.no_grad(), int8_rows.per_row():
                return best(run, repeats)
        finally:
            backend.few_rows_int8 = own

    print("\n| rows | step's blocks, gpt1's kernel ms | oneDNN's ms |")
    print("|---:|---:|---:|")
    for rows in (2, 4, 8, 16, 32, 64):
        mine = min(blocks(rows, True) for _ in range(2))
        theirs = min(blocks(rows, False) for _ in range(2))
        print(f"| {rows} | {mine * 1e3:.1f} | {theirs * 1e3:.1f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tier", choices=sorted(TIERS), default="host")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--step", action="store_true", help="also time the step's blocks both ways")
    args = p.parse_args()
    enter_tier(args.tier)
    torch.set_num_threads(args.threads)
    from gpt1.inference import backend

    backend.expect_decoding()  # builds gpt1's kernel where it is not built
    kernels = backend.kernel_module()
    if kernels is None or not kernels.has_few_rows_int8():
        sys.exit("gpt1's int8 kernel is not built for this CPU (it needs AVX2 or AVX-512 VNNI)")
    rates(kernels, args.repeats)
    against_float(kernels, args.repeats)
    if args.step:
        step_kernels(args.repeats)


if __name__ == "__main__":
    main()
