"""Plot a run's training/validation loss and learning rate (PNG files in the run folder).

Example:
  gpt1 plot runs/mini               # writes runs/mini/loss.png and runs/mini/lr.png
  gpt1 plot runs/mini --overwrite   # redraw them (pretrain draws them when it finishes)
"""

from __future__ import annotations

import argparse

HELP = "write loss and learning-rate plots (PNG) for a training run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import add_overwrite

    p.add_argument("run", metavar="RUN", help="a run folder with metrics.jsonl")
    add_overwrite(p, "existing loss.png / lr.png")


def run(args: argparse.Namespace) -> int:
    from gpt1.train.telemetry import plot_run

    for path in plot_run(args.run, overwrite=args.overwrite):
        print(path)
    return 0
