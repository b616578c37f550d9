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


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    options.add_scoring(p, "dev (default), test, or a task's split name")
    p.add_argument("--json", action="store_true", help="print the results as JSON (last line)")
    p.add_argument("--out", metavar="DIR", help="where to write results.SPLIT.json (default RUN)")


def run(args: argparse.Namespace) -> int:
    from gpt1.cli.finetune import results_summary
    from gpt1.cli.options import from_flags
    from gpt1.recipes.evaluate import ScoringOptions, evaluate_run, results_path

    results = evaluate_run(from_flags(ScoringOptions, args))
    if args.json:
        print(json.dumps(results))
    else:
        print(results_summary(results))
        print(f"wrote {results_path(args.run, results['split'], args.out)}")
    return 0
