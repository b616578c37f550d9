"""Run GPT-1's whole pipeline in a few minutes on a CPU, with no data and no network.

With no flags: a deterministic synthetic corpus and task (facts about invented creatures stated
only in the unlabelled text), a tokenizer trained on it, a small model pretrained on it, and
fine-tuning with pretraining, without it and without the auxiliary LM; then a zero-shot check and
a Markdown report with loss curves in the output folder. Re-running continues where it stopped.

Examples:
  gpt1 demo
  gpt1 demo --out runs/demo2 --seed 1
  gpt1 demo --corpus books/ --task sst2 --data glue/SST-2 --out runs/mydemo
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "the whole pipeline on an embedded synthetic task in a few minutes (no data needed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--seed", type=int, default=0, help="seed for the world and every run")
    p.add_argument("--pretrain-steps", type=int, default=800, help="pretraining updates")
    p.add_argument(
        "--corpus",
        nargs="+",
        default=[],
        metavar="PATH",
        help="your own unlabelled text (.txt/.jsonl files or folders)",
    )
    p.add_argument("--task", help="with --corpus: a task name (e.g. sst2) or csv/tsv/jsonl")
    p.add_argument("--data", metavar="DIR", help="with --corpus: the task's folder")
    p.add_argument(
        "--columns",
        metavar="ROLE=COL,...",
        help="with --task csv/tsv/jsonl: as gpt1 finetune --columns",
    )
    p.add_argument(
        "--labels",
        metavar="L1,L2,...",
        help="with --task csv/tsv/jsonl: class names in order (default: sorted)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON (last line)")
    options.add_overwrite(
        p,
        "the demo's files in a --out that also holds other files (those are left "
        "alone; a rerun into the demo's own folder reuses its finished steps)",
    )


def run(args: argparse.Namespace) -> int:
    from gpt1.cli import options
    from gpt1.recipes.demo import DemoSettings, demo, format_table

    settings = options.from_flags(DemoSettings, args, out=Path(args.out))
    summary = demo(settings)
    print(format_table(summary))
    if args.json:
        print(json.dumps(summary))
    return 0
