"""Plot training runs: one run's loss and learning rate, or one metric of several runs side by side.

Examples:
  gpt1 plot runs/mini               # writes runs/mini/loss.png and runs/mini/lr.png
  gpt1 plot runs/mini --overwrite   # redraw them (pretrain draws them when it finishes)
  gpt1 plot runs/a runs/b --metric val_loss              # writes compare-val_loss.png here
  gpt1 plot runs/a runs/b runs/c --metric loss --out cmp.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write loss and learning-rate plots (PNG) for a run, or compare several runs"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    p.add_argument("run", metavar="RUN", nargs="+", help="run folders with metrics.jsonl")
    p.add_argument(
        "--metric",
        help="one metrics.jsonl field (loss, val_loss, lr, grad_norm, tokens_per_s, mfu, "
        "dev_accuracy, ...) drawn for every RUN on one figure (default with several runs: loss)",
    )
    p.add_argument(
        "--out",
        metavar="FILE.png",
        help="the comparison figure (default: compare-METRIC.png in the current folder with "
        "several runs, RUN/METRIC.png with one)",
    )
    options.add_overwrite(p, "existing plots")


def run(args: argparse.Namespace) -> int:
    from gpt1.train.telemetry import plot_run, plot_runs

    if len(args.run) == 1 and args.metric is None:
        if args.out:
            from gpt1.errors import ConfigError

            raise ConfigError("--out names a --metric figure; pass --metric too")
        for path in plot_run(args.run[0], overwrite=args.overwrite):
            print(path)
        return 0
    metric = args.metric or "loss"
    default = (
        Path(args.run[0]) / f"{metric}.png" if len(args.run) == 1 else Path(f"compare-{metric}.png")
    )
    print(plot_runs(args.run, metric, args.out or default, overwrite=args.overwrite))
    return 0
