"""Write GLUE-style submission files (`index<TAB>prediction`) for a fine-tuned run.

Examples:
  gpt1 predict runs/cola --task cola --data glue/CoLA            # -> runs/cola/submission/CoLA.tsv
  gpt1 predict runs/mnli --task mnli --data glue/MNLI --out sub  # -> sub/MNLI-m.tsv, sub/MNLI-mm.tsv
"""
from __future__ import annotations

import argparse

HELP = "write submission files (index, prediction) for a split"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="fine-tuned run or checkpoint folder")
    p.add_argument("--task", help="task name (checked against the run's task)")
    p.add_argument("--data", metavar="DIR", required=True, help="folder with the task's files")
    p.add_argument("--split", default="test", help="test (default), dev, or a task's split name")
    p.add_argument("--out", metavar="DIR", help="where to write (default RUN/submission)")
    p.add_argument("--micro-batch", type=int, default=16, help="examples per forward pass")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed rows (counted and reported) instead of stopping")


def run(args: argparse.Namespace) -> int:
    from gpt1.evaluate import predict_run
    for path in predict_run(args.run, args.task, args.data, args.split, args.out,
                            args.micro_batch, args.skip_bad_rows, args.device):
        print(path)
    return 0
