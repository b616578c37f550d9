"""Print a model's config, parameter counts and training FLOPs per token.

Examples:
  gpt1 info gpt1
  gpt1 info runs/mini/final --json
"""

from __future__ import annotations

import argparse
import json

HELP = "show a preset's or checkpoint's config, parameter count and FLOPs per token"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        metavar="PRESET|CHECKPOINT",
        help="a preset name (gpt1, mini, tiny) or a checkpoint / run folder",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="context length for the attention FLOPs (default: n_positions)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from gpt1.recipes.info import describe

    info = describe(args.model, seq_len=args.seq_len)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"model: {info['source']}")
    for key, value in info["config"].items():
        print(f"  {key:20s} {value}")
    print(f"parameters:            {info['parameters']:,}")
    print(f"  without embeddings:  {info['parameters_without_embeddings']:,}")
    print(f"training FLOPs/token:  {info['flops_per_token']:.4g} (seq_len {info['seq_len']})")
    return 0
