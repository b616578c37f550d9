"""Peak memory of one training step: gpt1's trainer pieces against transformers' OpenAIGPTLMHeadModel.

Each case runs in its own process (peak RSS only grows), with the same config, the same weights
(converted with gpt1.recipes.convert), the same batch, dropout 0.1 and an Adam step:

- hf:   `OpenAIGPTLMHeadModel(..., labels=)` + loss.backward() + torch Adam, as its users train it;
- gpt1: `GPT` + `gpt1.train.objectives.lm_loss_window` (chunked tied-head loss, no full fp32 logits kept)
        + OAI Adam, optionally with activation checkpointing.

Prints peak RSS (CPU) or max allocated (CUDA), tokens/s of the steps after the first, and the
first-step loss (which must agree between the two).

    python benchmarks/memory.py                              # paper model, micro-batch 8 x 512, fp32 + bf16
    python benchmarks/memory.py --size mini --precision bf16
    python benchmarks/memory.py --checkpointing              # also gpt1 with activation checkpointing
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {
    "gpt1": dict(vocab_size=40478, n_positions=512, n_embd=768, n_layer=12, n_head=12),
    "mini": dict(vocab_size=40478, n_positions=256, n_embd=384, n_layer=6, n_head=6),
    "tiny": dict(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2),
}


def peak_memory(device) -> float:
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def run_case(args: argparse.Namespace) -> dict:
    """One implementation, one precision: build, run `steps` training steps, measure."""
    import torch

    from gpt1.config import ModelConfig, TrainConfig
    from gpt1.model.gpt import GPT

    torch.manual_seed(0)
    device = torch.device(args.device)
    cfg = ModelConfig(**SIZES[args.size])
    if args.no_dropout:  # makes the two first-step losses comparable digit for digit
        cfg = cfg.derive(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
    T = args.seq_len or cfg.n_positions
    ours = GPT(cfg)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, cfg.vocab_size, (args.micro_batch, T + 1), generator=g).to(device)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if args.precision == "bf16"
        else nullcontext()
    )
    if args.impl == "hf":
        from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

        from gpt1.recipes.convert import gpt1_to_hf_state

        hf_cfg = OpenAIGPTConfig(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.n_positions,
            n_embd=cfg.n_embd,
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            afn="gelu",
            embd_pdrop=cfg.embd_pdrop,
            attn_pdrop=cfg.attn_pdrop,
            resid_pdrop=cfg.resid_pdrop,
        )
        model = OpenAIGPTLMHeadModel(hf_cfg)
        model.load_state_dict(gpt1_to_hf_state(ours.state_dict()), strict=False)
        model.tie_weights()
        del ours
        model.to(device).train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)

        def loss_of():
            # labels are shifted inside the model: pass the full window's first T+1 - 1 tokens
            return model(input_ids=data[:, :T], labels=data[:, :T]).loss
    else:
        from gpt1.train.objectives import lm_loss
        from gpt1.train.optim import build_optimizer
        from gpt1.train.parallelize import checkpoint_blocks

        model = ours.to(device).train()
        if args.checkpointing:
            checkpoint_blocks(model)
        opt = build_optimizer(model, TrainConfig(lr=1e-4))

        def loss_of():
            # The same T positions and T - 1 shifted targets as HF's labels= path above.
            ids = data[:, :T]
            hidden, head = model(ids, with_head_weight=True)
            return lm_loss(head, hidden, ids)

    losses, times = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        with autocast:
            loss = loss_of()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    tokens = args.micro_batch * T  # positions run per step
    later = times[1:] or times
    return {
        "impl": args.impl + ("+ckpt" if args.checkpointing else ""),
        "precision": args.precision,
        "peak_gb": peak_memory(device),
        "tokens_per_s": tokens / (sum(later) / len(later)),
        "first_loss": losses[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", choices=list(SIZES), default="gpt1")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=0, help="default: n_positions")
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--checkpointing", action="store_true", help="also gpt1 with activation checkpointing"
    )
    p.add_argument(
        "--no-dropout", action="store_true", help="dropout 0 so both losses agree exactly"
    )
    p.add_argument("--impl", choices=["hf", "gpt1"], help=argparse.SUPPRESS)  # child process
    args = p.parse_args()
    if args.impl:
        args.precision = args.precision[0]
        print(json.dumps(run_case(args)))
        return
    cases = [("hf", False), ("gpt1", False)] + ([("gpt1", True)] if args.checkpointing else [])
    print(
        f"size {args.size}, micro-batch {args.micro_batch} x {args.seq_len or SIZES[args.size]['n_positions']}"
        f" tokens, {args.steps} steps, device {args.device}"
    )
    print(f"{'impl':10s} {'precision':9s} {'peak GB':>8s} {'tok/s':>8s} {'loss':>8s}")
    for precision in args.precision:
        results = {}
        for impl, ckpt in cases:
            cmd = [
                sys.executable,
                __file__,
                "--impl",
                impl,
                "--size",
                args.size,
                "--micro-batch",
                str(args.micro_batch),
                "--seq-len",
                str(args.seq_len),
                "--precision",
                precision,
                "--steps",
                str(args.steps),
                "--device",
                args.device,
            ]
            cmd += ["--no-dropout"] if args.no_dropout else []
            out = subprocess.run(
                cmd + (["--checkpointing"] if ckpt else []), capture_output=True, text=True
            )
            if out.returncode:
                print(f"{impl} {precision}: failed\n{out.stderr[-2000:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[r["impl"]] = r
            print(
                f"{r['impl']:10s} {r['precision']:9s} {r['peak_gb']:8.2f} {r['tokens_per_s']:8.1f} "
                f"{r['first_loss']:8.4f}",
                flush=True,
            )
        hf = results.get("hf")
        for name, r in results.items():
            if hf and name != "hf":
                print(
                    f"{precision}: {name} / hf  peak memory {r['peak_gb'] / hf['peak_gb']:.2f}x, "
                    f"tokens/s {r['tokens_per_s'] / hf['tokens_per_s']:.2f}x, first loss "
                    f"{r['first_loss'] - hf['first_loss']:+.4f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
