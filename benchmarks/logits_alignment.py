"""Output-layer GEMM into unaligned vs 64-byte-aligned rows (why the scorer pads its buffers).

`h [n, C] @ E.T` with GPT-1's 40,478-token vocabulary writes rows of 161,912 bytes in fp32, not a
multiple of 64; this times the GEMM into a plain `[n, V]` tensor against the same GEMM into the
first V columns of a `[n, V rounded up to 16]` buffer, alternating, best of N.

    python benchmarks/logits_alignment.py                      # one thread, C=384
    python benchmarks/logits_alignment.py --n-embd 768 --threads 2
"""
from __future__ import annotations

import argparse
import time

import torch


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=40478)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--rows", default="306,824,1024")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    V, C = args.vocab, args.n_embd
    width = -(-V // 16) * 16
    print(f"V={V} (padded rows: {width}), C={C}, {args.threads} thread(s)")
    for dtype in (torch.float32, torch.bfloat16):
        E = (torch.randn(V, C) * 0.02).to(dtype)
        for n in map(int, args.rows.split(",")):
            h = torch.randn(n, C).to(dtype)
            plain, padded = torch.empty(n, V, dtype=dtype), torch.empty(n, width, dtype=dtype)
            a = best_ms(lambda: torch.mm(h, E.t(), out=plain), args.repeats)
            b = best_ms(lambda: torch.mm(h, E.t(), out=padded[:, :V]), args.repeats)
            gflop = 2 * n * C * V / 1e9
            print(f"{str(dtype):15s} n={n:5d}: [n, V] {a:7.1f} ms ({gflop / a * 1e3:5.1f} GFLOP/s)   "
                  f"aligned rows {b:7.1f} ms ({gflop / b * 1e3:5.1f} GFLOP/s)   {a / b:.2f}x", flush=True)


if __name__ == "__main__":
    main()
