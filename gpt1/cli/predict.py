"""Write predictions of a fine-tuned run: GLUE-style submission files (`index<TAB>prediction`), or
JSONL/CSV with each example's inputs, predicted label and class probabilities (--format).

Examples:
  gpt1 predict runs/cola --task cola --data glue/CoLA            # -> runs/cola/submission/CoLA.tsv
  gpt1 predict runs/cola --data glue/CoLA --split dev            # -> runs/cola/submission/CoLA.dev.tsv
  gpt1 predict runs/mnli --task mnli --data glue/MNLI --out sub  # -> sub/MNLI-m.tsv, sub/MNLI-mm.tsv
  gpt1 predict runs/mine --file held_out.csv --format jsonl     # -> runs/mine/predictions/held_out.jsonl

Test splits get GLUE's submission names; other splits add the split's file name; JSONL/CSV files
are named after the split (or --file's stem). An existing file is refused unless --overwrite.
"""

from __future__ import annotations

import argparse

HELP = "predict a split or file: submission TSV, or JSONL/CSV with probabilities"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    options.add_scoring(p, "test (default), dev, or a task's split name")
    p.add_argument(
        "--out", metavar="DIR", help="where to write (default RUN/submission, RUN/predictions)"
    )
    p.add_argument(
        "--format",
        choices=("tsv", "jsonl", "csv"),
        default="tsv",
        help="tsv (default): GLUE submission (index, prediction); jsonl/csv: id, inputs, "
        "label, gold and each class's probability, into RUN/predictions/SPLIT.jsonl|csv",
    )
    p.add_argument(
        "--raw-csv",
        action="store_true",
        help="--format csv: write text cells as they are; by default a cell starting with = + - "
        "@ (or a tab, a carriage return) gets a ' in front, so that a spreadsheet does not run "
        "it as a formula (numbers like -1 are left alone)",
    )


def run(args: argparse.Namespace) -> int:
    from gpt1.cli.options import from_flags
    from gpt1.recipes.evaluate import ScoringOptions, predict_run

    if args.raw_csv and args.format != "csv":
        from gpt1.errors import ConfigError

        raise ConfigError(f"--raw-csv applies to --format csv only (not {args.format})")
    paths = predict_run(from_flags(ScoringOptions, args), args.format, args.raw_csv)
    for path in paths:
        print(path)
    return 0
