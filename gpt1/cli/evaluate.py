"""Score a fine-tuned run on a task split; writes results.SPLIT.json into the run folder.

Examples:
  gpt1 evaluate runs/sst2 --task sst2 --data glue/SST-2 --split dev
  gpt1 evaluate runs/mnli --task mnli --data glue/MNLI --split dev --json   # matched + mismatched
"""
from __future__ import annotations

import argparse
import json

HELP = "score a fine-tuned run on a task split (writes RUN/results.SPLIT.json)"


def add_scoring_arguments(p: argparse.ArgumentParser, split: str, split_help: str) -> None:
    """The options `evaluate` and `predict` share: which run, which data, how to run it."""
    p.add_argument("run", metavar="RUN", help="fine-tuned run or checkpoint folder")
    p.add_argument("--task", help="task name (checked against the run's task)")
    p.add_argument("--data", metavar="DIR", required=True, help="folder with the task's files")
    p.add_argument("--split", default=split, help=split_help)
    p.add_argument("--micro-batch", type=int, default=16, help="examples per forward pass")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed rows (counted and reported) instead of stopping")
    from gpt1.cli import add_overwrite
    add_overwrite(p, "an existing output file")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_scoring_arguments(p, "dev", "dev, test, or a task's split name")
    p.add_argument("--json", action="store_true", help="print the results as JSON (last line)")


def run(args: argparse.Namespace) -> int:
    from gpt1.cli.finetune import _summary
    from gpt1.recipes.evaluate import evaluate_run
    results = evaluate_run(args.run, args.task, args.data, args.split, args.micro_batch,
                           args.skip_bad_rows, args.device, overwrite=args.overwrite)
    print(json.dumps(results) if args.json else _summary(results))
    return 0
