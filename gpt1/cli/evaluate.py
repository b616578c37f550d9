"""Score a fine-tuned run on a task split (dev unless --split says otherwise, or one --file); writes
results.SPLIT.json into the run folder (or into --out, e.g. when the run folder is read-only) and
prints where.

Examples:
  gpt1 evaluate runs/sst2 --task sst2 --data glue/SST-2 --split dev
  gpt1 evaluate runs/mnli --task mnli --data glue/MNLI --split dev --json   # matched + mismatched
  gpt1 evaluate runs/sst2 --data glue/SST-2 --out scores            # -> scores/results.dev.json
  gpt1 evaluate runs/mine --file held_out.csv                       # -> runs/mine/results.held_out.json
"""

from __future__ import annotations

import argparse
import json

HELP = "score a fine-tuned run on a task split (writes RUN/results.SPLIT.json)"


def add_scoring_arguments(p: argparse.ArgumentParser, split: str, split_help: str) -> None:
    """The options `evaluate` and `predict` share: which run, which data, how to run it."""
    p.add_argument("run", metavar="RUN", help="fine-tuned run or checkpoint folder")
    p.add_argument("--task", help="task name (checked against the run's task)")
    p.add_argument("--data", metavar="DIR", help="folder with the task's files (or --file)")
    p.add_argument(
        "--file",
        metavar="PATH",
        help="one file in the task's format instead of --data: a split named after its "
        "stem (held_out.csv -> held_out)",
    )
    from gpt1.devices import DEVICE_HELP, PRECISION_HELP, PRECISIONS

    p.add_argument("--split", help=split_help + "; any name is looked up as NAME.<ext>")
    p.add_argument(
        "--micro-batch", type=int, default=16, help="examples per forward pass (default 16)"
    )
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--precision", default="auto", choices=PRECISIONS, help=PRECISION_HELP)
    p.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip malformed rows (counted and reported) instead of stopping",
    )
    from gpt1.cli import add_overwrite

    add_overwrite(p, "an existing output file")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_scoring_arguments(p, "dev", "dev (default), test, or a task's split name")
    p.add_argument("--json", action="store_true", help="print the results as JSON (last line)")
    p.add_argument("--out", metavar="DIR", help="where to write results.SPLIT.json (default RUN)")


def run(args: argparse.Namespace) -> int:
    from gpt1.cli.finetune import _summary
    from gpt1.errors import ConfigError
    from gpt1.recipes.evaluate import evaluate_run, results_path

    if args.micro_batch < 1:
        raise ConfigError(f"--micro-batch must be >= 1, got {args.micro_batch}")
    results = evaluate_run(
        args.run,
        args.task,
        args.data,
        args.split,
        args.micro_batch,
        args.skip_bad_rows,
        args.device,
        args.precision,
        overwrite=args.overwrite,
        out=args.out,
        file=args.file,
    )
    if args.json:
        print(json.dumps(results))
    else:
        print(_summary(results))
        print(f"wrote {results_path(args.run, results['split'], args.out)}")
    return 0
