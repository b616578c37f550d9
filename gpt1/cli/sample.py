"""Generate text from a checkpoint: greedy (--temperature 0) or sampled with top-k / top-p.

Examples:
  gpt1 sample runs/mini/final --prompt "the old man" --max-new-tokens 40 --top-k 40 --seed 1
  gpt1 sample runs/mini/final --prompt-ids "12 7 99" --temperature 0
"""
from __future__ import annotations

import argparse

HELP = "generate text from a checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint folder or run folder")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text to continue (needs the checkpoint's tokenizer files)")
    src.add_argument("--prompt-ids", help='token ids to continue, e.g. "12 7 99"')
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate (default 50)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default: 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--num-samples", type=int, default=1,
                   help="independent continuations of the same prompt (default 1)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--ids", action="store_true", help="print token ids even when text is known")


def run(args: argparse.Namespace) -> int:
    from gpt1.recipes.sample import parse_ids, sample
    ids = parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    samples = sample(args.checkpoint, prompt=args.prompt, prompt_ids=ids,
                     max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                     top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                     num_samples=args.num_samples, device=args.device)
    for i, s in enumerate(samples):
        if len(samples) > 1:
            print(f"=== sample {i + 1} ===")
        if s.text is not None and not args.ids:
            prefix = args.prompt if args.prompt is not None else ""
            print(f"{prefix}{' ' if prefix else ''}{s.text}".strip())
        else:
            print(" ".join(str(t) for t in s.ids))
    return 0
