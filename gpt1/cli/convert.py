"""Convert model weights between the original OpenAI release, transformers and gpt1 checkpoints.

Examples:
  gpt1 convert finetune-transformer-lm/model ckpt/gpt1 --from openai
  gpt1 convert hf_folder ckpt/gpt1 --from hf
  gpt1 convert openai-community/openai-gpt ckpt/gpt1 --from hf     (fetched when online)
  gpt1 convert ckpt/gpt1 hf_out --from gpt1 --to hf
  gpt1 convert runs/sst2 sst2.onnx --from gpt1 --to onnx     (the classifier, or the LM)
"""

from __future__ import annotations

import argparse

HELP = "convert weights: original OpenAI shards / transformers folder <-> gpt1 checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="SRC", help="source folder (or an HF hub name with --from hf)")
    from gpt1.cli import options

    p.add_argument(
        "dst", metavar="DST", help="folder to create (written under a temporary name, then renamed)"
    )
    options.add_overwrite(p, "an existing DST (never one that holds SRC or the current folder)")
    p.add_argument(
        "--from",
        dest="src_format",
        required=True,
        choices=["openai", "hf", "gpt1"],
        help="format of SRC",
    )
    p.add_argument(
        "--to",
        dest="dst_format",
        default="gpt1",
        choices=["gpt1", "hf", "onnx"],
        help="format of DST (default: gpt1; onnx: DST is a .onnx file)",
    )
    p.add_argument(
        "--n-head",
        type=int,
        default=12,
        help="attention heads for --from openai (not recorded in the shapes; GPT-1: 12)",
    )


def run(args: argparse.Namespace) -> int:
    from gpt1.extras import require
    from gpt1.recipes.convert import convert

    if args.dst_format == "onnx":  # checked before the source is read
        require("onnx", "onnx", "onnxscript", what="gpt1 convert --to onnx")

    notes: list[str] = []
    out = convert(
        args.src,
        args.dst,
        args.src_format,
        args.dst_format,
        n_head=args.n_head,
        overwrite=args.overwrite,
        notes=notes,
    )
    print(f"wrote {args.dst_format} model to {out}")
    for note in notes:
        print(note.replace("DIR", str(out)))
    return 0
