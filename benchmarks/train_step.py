"""Training-step throughput: gpt1's GPT against transformers' OpenAIGPTLMHeadModel, one process.

Both sides get the same config, the same weights (converted with gpt1.convert), the same batch and
dropout 0.1, and run forward + LM loss + backward + Adam step. Rounds alternate between the two so
that background load hits both alike; the median over rounds is reported, in fp32 and in bf16
autocast. Each side is used the way its users would use it: transformers computes its loss through
`labels=` (shifted inside the model), gpt1 through `gpt1.objectives.lm_loss_window` on shifted targets.

    python benchmarks/train_step.py                      # defaults: 6 x 384, 6 heads, T=256, B=8
    python benchmarks/train_step.py --rounds 7 --steps 3 --dtype fp32
    python benchmarks/train_step.py --compile            # also torch.compile'd gpt1, reported apart
    python benchmarks/train_step.py --profile ours       # where the time goes (torch.profiler)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpt1 import GPT, ModelConfig  # noqa: E402
from gpt1.model import flops_per_token  # noqa: E402
from gpt1.convert import gpt1_to_hf_state  # noqa: E402
from gpt1.objectives import lm_loss_window  # noqa: E402


def build(args: argparse.Namespace):
    config = ModelConfig(vocab_size=args.vocab, n_positions=args.seq_len, n_embd=args.n_embd,
                         n_layer=args.n_layer, n_head=args.n_head)
    torch.manual_seed(0)
    ours = GPT(config).train()
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel
    hf_config = OpenAIGPTConfig(vocab_size=args.vocab, n_positions=args.seq_len, n_embd=args.n_embd,
                                n_layer=args.n_layer, n_head=args.n_head, afn="gelu")
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
    print(f"config: {args.n_layer} layers x {args.n_embd}, {args.n_head} heads, T={args.seq_len}, "
          f"batch {args.batch}, vocab {args.vocab}, dropout 0.1, threads {args.threads}, "
          f"{'plain' if args.plain_adam else 'fused'} Adam for gpt1")
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
        for name, v in per_round.items():
            print(f"{dtype:5s} {name:14s} median {med[name]:8.0f} tok/s  "
                  f"{med[name] * flops / 1e9:6.1f} GFLOP/s   rounds: {' '.join(f'{t:.0f}' for t in v)}")
        for name in sides:
            if name != "transformers":
                ratios = [a / b for a, b in zip(per_round[name], per_round["transformers"])]
                print(f"{dtype:5s} ratio {name}/transformers: {med[name] / med['transformers']:.2f}x "
                      f"(per-round median {statistics.median(ratios):.2f}x)")


def profile(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    ours, theirs = build(args)
    step_ours, step_theirs = make_steps(ours, theirs, args)
    step = step_ours if args.profile == "ours" else step_theirs
    ctx = autocast_for(args.dtype.split(",")[0])
    timed(step, 1, ctx)
    from torch.profiler import ProfilerActivity, profile as prof
    with prof(activities=[ProfilerActivity.CPU]) as p:
        timed(step, args.steps, ctx)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dtype", default="fp32,bf16", help="comma list of fp32, bf16 (autocast)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="steps per side per round")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plain-adam", action="store_true", help="unfused Adam for gpt1 too")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(gpt1)")
    ap.add_argument("--profile", choices=["ours", "theirs"], help="profile one side and exit")
    args = ap.parse_args()
    profile(args) if args.profile else run(args)


if __name__ == "__main__":
    main()
