"""Output-layer GEMM into unaligned vs 64-byte-aligned rows (why the scorer pads its buffers).

`h [n, C] @ E.T` with GPT-1's 40,478-token vocabulary writes rows of 161,912 bytes in fp32, not a
multiple of 64; this times the GEMM into a plain `[n, V]` tensor against the same GEMM into the
first V columns of a `[n, V rounded up to 16]` buffer, alternating, best of N.

    python benchmarks/logits_alignment.py                      # one thread, C=384
    python benchmarks/logits_alignment.py --n-embd 768 --threads 2
    python benchmarks/logits_alignment.py --loss --n-embd 768 --threads 2   # the training loss

`--loss` times gpt1's chunked LM loss (forward + backward, 2,048 positions) with its aligned
logits rows against the same loss with plain `h @ W.T` logits, alternating, best of N (in bf16
the loss does not pad its rows, so both sides run the same code there).
"""

from __future__ import annotations

import argparse
import time

import torch


def best_ms(fn, repeats: int) -> float:
    """The shortest of `repeats` timed calls after a warm-up, in milliseconds."""
    from gpt1.inference.backend import best_time

    return best_time(fn, repeats) * 1e3


def loss_ab(V: int, C: int, repeats: int, n: int = 2048) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gpt1.train import chunked_ce

    aligned = chunked_ce.aligned_logits
    variants = {"plain rows": lambda h, w: h @ w.t(), "aligned rows": aligned}
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, C, generator=g).requires_grad_()
    w = (torch.randn(V, C, generator=g) * 0.02).requires_grad_()
    y, weights = torch.randint(0, V, (n,), generator=g), torch.full((n,), 1.0 / n)
    for dtype in ("fp32", "bf16"):

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                loss = chunked_ce.chunked_cross_entropy(h, w, y, weights)
            loss.backward()
            h.grad = w.grad = None

        best = {name: float("inf") for name in variants}
        for round_ in range(repeats + 1):
            for name, fn in variants.items():
                chunked_ce.aligned_logits = fn
                start = time.perf_counter()
                step()
                if round_:  # the first round warms both up
                    best[name] = min(best[name], time.perf_counter() - start)
        chunked_ce.aligned_logits = aligned
        a, b = best["plain rows"], best["aligned rows"]
        print(
            f"chunked LM loss, {dtype}, {n} positions: plain rows {a * 1e3:.0f} ms, "
            f"aligned rows {b * 1e3:.0f} ms, {a / b:.2f}x",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vocab", type=int, default=40478)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--rows", default="306,824,1024")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--loss", action="store_true", help="time the chunked LM loss instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    V, C = args.vocab, args.n_embd
    if args.loss:
        return loss_ab(V, C, args.repeats)
    width = -(-V // 16) * 16  # gpt1.train.chunked_ce.logits_width in fp32
    print(f"V={V} (padded rows: {width}), C={C}, {args.threads} thread(s)")
    for dtype in (torch.float32, torch.bfloat16):
        E = (torch.randn(V, C) * 0.02).to(dtype)
        for n in map(int, args.rows.split(",")):
            h = torch.randn(n, C).to(dtype)
            plain, padded = torch.empty(n, V, dtype=dtype), torch.empty(n, width, dtype=dtype)
            a = best_ms(lambda: torch.mm(h, E.t(), out=plain), args.repeats)
            b = best_ms(lambda: torch.mm(h, E.t(), out=padded[:, :V]), args.repeats)
            gflop = 2 * n * C * V / 1e9
            print(
                f"{str(dtype):15s} n={n:5d}: [n, V] {a:7.1f} ms ({gflop / a * 1e3:5.1f} GFLOP/s)   "
                f"aligned rows {b:7.1f} ms ({gflop / b * 1e3:5.1f} GFLOP/s)   {a / b:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
