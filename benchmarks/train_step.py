"""Training-step throughput: gpt1's GPT against transformers' OpenAIGPTLMHeadModel, one process.

Both sides get the same config, the same weights (converted with gpt1.recipes.convert), the same batch and
dropout 0.1, and run forward + LM loss + backward + Adam step. Rounds alternate between the two so
that background load hits both alike; the median over rounds is reported, in fp32 and in bf16
autocast. Each side is used the way its users would use it: transformers computes its loss through
`labels=` (shifted inside the model), gpt1 through `gpt1.train.objectives.lm_loss_window` on shifted targets.

    python benchmarks/train_step.py                      # defaults: 6 x 384, 6 heads, T=256, B=8
    python benchmarks/train_step.py --rounds 7 --steps 3 --dtype fp32
    python benchmarks/train_step.py --compile            # also torch.compile'd gpt1, reported apart
    python benchmarks/train_step.py --profile ours       # where the time goes (torch.profiler)

Whole pretraining steps on real data (`--data DIR`, a `gpt1 prepare` folder; vocabulary from it):
both sides draw the same windows from two identically seeded `gpt1.text.windows.WindowSource`s. gpt1 runs
the trainer's step (`gpt1.train.loop`: OAI Adam from `build_optimizer`, scheduled lr, autocast,
`WindowLMLoss`, accumulation, `_clip`); transformers runs a plain loop: logits -> fp32
cross-entropy on the same targets, backward, `clip_grad_norm_`, `torch.optim.AdamW`. A matmul
peak probe (large square GEMMs, best of repeated runs, same threads) runs in the same process,
so achieved model FLOP/s (6N + attention per token) is also printed as % of the peak.

    python benchmarks/train_step.py --data data/novels              # mini shape, B=8, T=256
    python benchmarks/train_step.py --data DIR --accum 4 --dtype bf16
    python benchmarks/train_step.py --data DIR --via-train   # + gpt1.train.loop.train's own tokens/s
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemm_profile import gemm_seconds  # noqa: E402  (benchmarks/)

from gpt1 import GPT, ModelConfig  # noqa: E402
from gpt1.config import TrainConfig  # noqa: E402
from gpt1.model.gpt import flops_per_token  # noqa: E402
from gpt1.recipes.convert import gpt1_to_hf_state  # noqa: E402
from gpt1.text.windows import WindowSource, open_prepared  # noqa: E402
from gpt1.train.loop import _clip, to_device  # noqa: E402
from gpt1.train.objectives import (
    WindowLMLoss,  # noqa: E402
    lm_loss_window,  # noqa: E402
)
from gpt1.train.optim import build_optimizer, lr_at, set_lr  # noqa: E402


def build(args: argparse.Namespace):
    config = ModelConfig(
        vocab_size=args.vocab,
        n_positions=args.seq_len,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
    )
    torch.manual_seed(0)
    ours = GPT(config).train()
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    hf_config = OpenAIGPTConfig(
        vocab_size=args.vocab,
        n_positions=args.seq_len,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        afn="gelu",
    )
    hf_config._attn_implementation = "eager"  # the only implementation OpenAIGPT has
    theirs = OpenAIGPTLMHeadModel(hf_config).train()
    missing, unexpected = theirs.load_state_dict(gpt1_to_hf_state(ours.state_dict()), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    theirs.tie_weights()
    return ours, theirs


def make_steps(ours, theirs, args):
    """One closure per side: a full training step on a fixed batch."""
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]  # [B, T] inputs and next-token targets

    opt_ours = torch.optim.Adam(ours.parameters(), lr=1e-4, fused=not args.plain_adam)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=1e-4)

    def step_ours(model=ours):
        loss = lm_loss_window(ours, model(x), y)  # the project's fused, chunked LM loss
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)
        return loss

    def step_theirs():
        loss = theirs(input_ids=x, labels=x).loss
        loss.backward()
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)
        return loss

    return step_ours, step_theirs


def make_pretrain_steps(ours, theirs, args):
    """Whole pretraining steps on real windows: gpt1 as its trainer runs one, HF in a plain loop.

    Each closure returns the step's mean loss (a float, so the step is finished when timed).
    """
    split = open_prepared(args.data).splits["train"]
    src_ours = WindowSource(split, args.seq_len, seed=0)
    src_theirs = WindowSource(split, args.seq_len, seed=0)  # same seed: the same windows
    cfg = TrainConfig(
        micro_batch_size=args.batch,
        batch_size=args.batch * args.accum,
        max_steps=10**6,
        lr=args.lr,
        warmup=0,
        schedule="constant",
        precision="fp32",
        grad_clip=1.0,
        weight_decay=0.01,
    )
    opt_ours = build_optimizer(ours, cfg)  # OAI Adam, fused
    loss_fn = WindowLMLoss(cfg.loss_chunk_tokens)
    device = torch.device("cpu")
    state = {"step": 0}

    def step_ours():
        # gpt1.train.loop._update, one optimizer update (logging, checkpoints and DDP sync aside).
        set_lr(opt_ours, lr_at(state["step"], cfg, cfg.max_steps))
        loss_sum = torch.zeros(())
        for _ in range(args.accum):
            batch = to_device(src_ours.next_batch(cfg.micro_batch_size), device)
            loss, _ = loss_fn(ours, batch)  # inside the caller's autocast, as in train()
            (loss / args.accum).backward()
            loss_sum += loss.detach().float()
        _clip(ours, cfg.grad_clip)
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)
        state["step"] += 1
        return float(loss_sum) / args.accum

    opt_theirs = torch.optim.AdamW(theirs.parameters(), lr=args.lr, weight_decay=0.01)

    def step_theirs():
        loss_sum = 0.0
        for _ in range(args.accum):
            x, y = src_theirs.next_batch(args.batch)  # [B, T] inputs and targets
            logits = theirs(input_ids=x).logits  # [B, T, V]
            # What HF's own LM loss does: upcast the logits, mean cross-entropy.
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            (loss / args.accum).backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)
        return loss_sum / args.accum

    return step_ours, step_theirs


def matmul_peak(dtype: torch.dtype, seconds: float, sizes=(1024, 2048, 3072)) -> float:
    """Best FLOP/s of large square GEMMs in `dtype` over about `seconds` (current thread count)."""
    gen = torch.Generator().manual_seed(0)
    best = 0.0
    for n in sizes:
        a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
        out = torch.empty(n, n, dtype=dtype)
        torch.mm(a, b, out=out)  # warm-up, allocates nothing later
        end = time.perf_counter() + seconds / len(sizes)
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            best = max(best, 2.0 * n**3 / (time.perf_counter() - t0))
    return best


def gemm_share(step, ctx, n: int = 2) -> tuple[float, float]:
    """(seconds in GEMM kernels, wall seconds) per step, from a torch.profiler run of `n` steps
    (`gemm_profile`): transformers' step time over gpt1's GEMM time bounds the ratio any further
    removal of gpt1's other work (dropout, casts, GELU, softmax, optimizer) could reach here."""
    gemm, wall = gemm_seconds(lambda: timed(step, n, ctx))
    return gemm / n, wall / n


def print_gemm_ceiling(dtype: str, sides: dict, ctx, hf_step_seconds: float) -> None:
    """The profiled GEMM time of both sides, and the ratio bound it implies: transformers' real
    (unprofiled, median) step time over gpt1's GEMM time."""
    shares = {name: gemm_share(sides[name], ctx) for name in ("gpt1", "transformers")}
    (g_ours, w_ours), (g_hf, w_hf) = shares["gpt1"], shares["transformers"]
    print(
        f"{dtype:5s} GEMM time per step (profiled): gpt1 {g_ours:.3f} s of {w_ours:.3f} s "
        f"({100 * g_ours / w_ours:.0f}%), transformers {g_hf:.3f} s of {w_hf:.3f} s "
        f"({100 * g_hf / w_hf:.0f}%)"
    )
    print(
        f"{dtype:5s} GEMM-bound ceiling: transformers' median step {hf_step_seconds:.3f} s / "
        f"gpt1's GEMMs {g_ours:.3f} s = {hf_step_seconds / g_ours:.2f}x (the ratio if all of "
        f"gpt1's non-GEMM work took no time)"
    )


def run_pretrain(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    args.vocab = open_prepared(args.data).vocab_size
    ours, theirs = build(args)
    step_ours, step_theirs = make_pretrain_steps(ours, theirs, args)
    sides = {"gpt1": step_ours, "transformers": step_theirs}
    tokens = args.batch * args.seq_len * args.accum
    flops = flops_per_token(ours.config, args.seq_len)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    peaks = {d: matmul_peak(dtypes[d], args.peak_seconds) for d in args.dtype.split(",")}
    print(
        f"whole pretraining steps on {args.data}: {args.n_layer} layers x {args.n_embd}, "
        f"{args.n_head} heads, T={args.seq_len}, micro-batch {args.batch} x {args.accum} "
        f"accumulation, vocab {args.vocab}, dropout 0.1, threads {args.threads}; gpt1: trainer "
        f"step with OAI Adam; transformers: plain loop with torch AdamW + clip_grad_norm_"
    )
    print(f"model FLOPs per token {flops / 1e6:.1f} M (6N + attention); {tokens} tokens per step")
    for dtype in args.dtype.split(","):
        ctx = autocast_for(dtype)
        for step in sides.values():
            timed(step, args.warmup, ctx)
        per_round = {name: [] for name in sides}
        losses = {name: [] for name in sides}
        for r in range(args.rounds):
            order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
            for name, step in order:
                start = time.perf_counter()
                for _ in range(args.steps):
                    with ctx():
                        losses[name].append(step())
                per_round[name].append(tokens * args.steps / (time.perf_counter() - start))
        # Probe again after the rounds: the peak is the best seen (background load only lowers it).
        peaks[dtype] = max(peaks[dtype], matmul_peak(dtypes[dtype], args.peak_seconds))
        peak = peaks[dtype]
        print(
            f"{dtype:5s} matmul peak {peak / 1e9:7.1f} GFLOP/s (best square GEMM, {args.threads} threads)"
        )
        med = {name: statistics.median(v) for name, v in per_round.items()}
        for name, v in per_round.items():
            rate = med[name] * flops
            print(
                f"{dtype:5s} {name:13s} median {med[name]:7.0f} tok/s  {rate / 1e9:6.1f} GFLOP/s = "
                f"{100 * rate / peak:5.1f}% of peak   mean loss {statistics.fmean(losses[name]):.4f}"
                f"   rounds: {' '.join(f'{t:.0f}' for t in v)}"
            )
        ratios = [a / b for a, b in zip(per_round["gpt1"], per_round["transformers"])]
        hf_share = med["transformers"] * flops / peak
        print(
            f"{dtype:5s} ratio gpt1/transformers: {med['gpt1'] / med['transformers']:.2f}x "
            f"(per-round median {statistics.median(ratios):.2f}x); ceiling at 100% of peak: "
            f"{1 / hf_share:.2f}x"
        )
        print_gemm_ceiling(dtype, sides, ctx, tokens / med["transformers"])
    print(
        "first timed step losses (same weights before warm-up, same windows; dropout masks differ): "
        + ", ".join(f"{n} {l[0]:.4f}" for n, l in losses.items())
    )
    if args.via_train:
        for dtype in args.dtype.split(","):
            check_with_train(args, dtype)


def check_with_train(args: argparse.Namespace, dtype: str) -> None:
    """Cross-check: gpt1.train.loop.train itself on the same data, its own tokens/s log (not interleaved)."""
    import json
    import tempfile

    from gpt1.train.loop import train

    steps = args.warmup + args.rounds * args.steps
    config = ModelConfig(
        vocab_size=args.vocab,
        n_positions=args.seq_len,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
    )
    torch.manual_seed(0)
    model = GPT(config)
    cfg = TrainConfig(
        micro_batch_size=args.batch,
        batch_size=args.batch * args.accum,
        max_steps=steps,
        lr=args.lr,
        warmup=0,
        schedule="constant",
        precision=dtype,
        grad_clip=1.0,
        weight_decay=0.01,
        save_every=0,
        eval_every=0,
        log_every=1,
        quiet=True,
        device="cpu",
        peak_flops=1.0,
    )
    source = WindowSource(open_prepared(args.data).splits["train"], args.seq_len, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        train(model, WindowLMLoss(cfg.loss_chunk_tokens), source, cfg, Path(tmp) / "run")
        records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").open()]
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r][args.warmup :]
    print(
        f"{dtype:5s} gpt1 via gpt1.train.loop.train: median {statistics.median(rates):7.0f} tok/s over "
        f"{len(rates)} logged steps (its own loop, run after the rounds)"
    )


def timed(step, n: int, ctx) -> float:
    start = time.perf_counter()
    for _ in range(n):
        with ctx():
            step()
    return (time.perf_counter() - start) / n


def autocast_for(dtype: str):
    if dtype == "bf16":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return nullcontext


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    ours, theirs = build(args)
    step_ours, step_theirs = make_steps(ours, theirs, args)
    sides = {"gpt1": step_ours, "transformers": step_theirs}
    if args.compile:
        compiled = torch.compile(ours)
        sides["gpt1+compile"] = lambda: step_ours(model=compiled)
    tokens = args.batch * args.seq_len
    # Model FLOPs per token (6N + attention): both sides must do these matmuls, so their rate
    # bounds the achievable ratio; everything else is what an implementation can save.
    flops = flops_per_token(ours.config, args.seq_len)
    print(
        f"config: {args.n_layer} layers x {args.n_embd}, {args.n_head} heads, T={args.seq_len}, "
        f"batch {args.batch}, vocab {args.vocab}, dropout 0.1, threads {args.threads}, "
        f"{'plain' if args.plain_adam else 'fused'} Adam for gpt1"
    )
    for dtype in args.dtype.split(","):
        ctx = autocast_for(dtype)
        for step in sides.values():
            timed(step, args.warmup, ctx)
        per_round = {name: [] for name in sides}
        for r in range(args.rounds):
            order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
            for name, step in order:
                per_round[name].append(tokens / timed(step, args.steps, ctx))
        med = {name: statistics.median(v) for name, v in per_round.items()}
        peak = matmul_peak(torch.bfloat16 if dtype == "bf16" else torch.float32, args.peak_seconds)
        print(
            f"{dtype:5s} matmul peak {peak / 1e9:7.1f} GFLOP/s (best square GEMM, {args.threads} threads)"
        )
        for name, v in per_round.items():
            print(
                f"{dtype:5s} {name:14s} median {med[name]:8.0f} tok/s  "
                f"{med[name] * flops / 1e9:6.1f} GFLOP/s = {100 * med[name] * flops / peak:5.1f}% of peak"
                f"   rounds: {' '.join(f'{t:.0f}' for t in v)}"
            )
        for name in sides:
            if name != "transformers":
                ratios = [a / b for a, b in zip(per_round[name], per_round["transformers"])]
                print(
                    f"{dtype:5s} ratio {name}/transformers: {med[name] / med['transformers']:.2f}x "
                    f"(per-round median {statistics.median(ratios):.2f}x)"
                )
        # The model's matmuls alone bound any implementation: at 100% of peak, the best ratio is
        # peak / transformers' achieved rate.
        print(
            f"{dtype:5s} ceiling for any implementation / transformers (100% of peak): "
            f"{peak / (med['transformers'] * flops):.2f}x"
        )
        print_gemm_ceiling(dtype, sides, ctx, tokens / med["transformers"])


def profile(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    ours, theirs = build(args)
    step_ours, step_theirs = make_steps(ours, theirs, args)
    step = step_ours if args.profile == "ours" else step_theirs
    ctx = autocast_for(args.dtype.split(",")[0])
    timed(step, 1, ctx)
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with prof(activities=[ProfilerActivity.CPU]) as p:
        timed(step, args.steps, ctx)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dtype", default="fp32,bf16", help="comma list of fp32, bf16 (autocast)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="steps per side per round")
    ap.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed steps per side and dtype first (a cold heap page-faults: after "
        "one, transformers' first bf16 rounds ran ~15%% slow)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plain-adam", action="store_true", help="unfused Adam for gpt1 too")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(gpt1)")
    ap.add_argument("--profile", choices=["ours", "theirs"], help="profile one side and exit")
    ap.add_argument("--data", help="a `gpt1 prepare` folder: time whole pretraining steps on it")
    ap.add_argument(
        "--accum", type=int, default=1, help="micro-batches per optimizer step (--data)"
    )
    ap.add_argument("--lr", type=float, default=2.5e-4, help="learning rate of both sides (--data)")
    ap.add_argument(
        "--via-train",
        action="store_true",
        help="also run gpt1.train.loop.train itself and report its logged tokens/s (--data)",
    )
    ap.add_argument(
        "--peak-seconds", type=float, default=1.5, help="time spent by each matmul peak probe"
    )
    args = ap.parse_args()
    if args.profile:
        profile(args)
    elif args.data:
        run_pretrain(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
