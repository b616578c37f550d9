"""Plot a run's training/validation loss and learning rate (PNG files in the run folder).

Example:
  gpt1 plot runs/mini        # writes runs/mini/loss.png and runs/mini/lr.png
"""
from __future__ import annotations

import argparse

HELP = "write loss and learning-rate plots (PNG) for a training run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help="a run folder with metrics.jsonl")


def run(args: argparse.Namespace) -> int:
    from gpt1.metrics import plot_run
    for path in plot_run(args.run):
        print(path)
    return 0
