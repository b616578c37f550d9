"""Write GLUE-style submission files (`index<TAB>prediction`) for a fine-tuned run.

Examples:
  gpt1 predict runs/cola --task cola --data glue/CoLA            # -> runs/cola/submission/CoLA.tsv
  gpt1 predict runs/cola --data glue/CoLA --split dev            # -> runs/cola/submission/CoLA.dev.tsv
  gpt1 predict runs/mnli --task mnli --data glue/MNLI --out sub  # -> sub/MNLI-m.tsv, sub/MNLI-mm.tsv

Test splits get GLUE's submission names; other splits add the split's file name. An existing
file is refused unless --overwrite.
"""

from __future__ import annotations

import argparse

HELP = "write submission files (index, prediction) for a split"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli.evaluate import add_scoring_arguments

    add_scoring_arguments(p, "test", "test (default), dev, or a task's split name")
    p.add_argument("--out", metavar="DIR", help="where to write (default RUN/submission)")


def run(args: argparse.Namespace) -> int:
    from gpt1.errors import ConfigError
    from gpt1.recipes.evaluate import predict_run

    if args.micro_batch < 1:
        raise ConfigError(f"--micro-batch must be >= 1, got {args.micro_batch}")
    for path in predict_run(
        args.run,
        args.task,
        args.data,
        args.split,
        args.out,
        args.micro_batch,
        args.skip_bad_rows,
        args.device,
        args.precision,
        overwrite=args.overwrite,
    ):
        print(path)
    return 0
