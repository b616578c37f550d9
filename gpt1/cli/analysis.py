"""The paper's analyses and two beyond it. Each writes into --out, records its exact commands in
OUT/commands.txt and, for sweeps, its finished sub-runs in OUT/sweep.json: run the same command
again after an interruption and it continues where it stopped.

Examples:
  gpt1 analysis positions runs/mini --out analysis/positions
  gpt1 analysis layers --init runs/mini --task sst2 --data ../shared/data/glue/SST-2 --out analysis/layers
  gpt1 analysis ablations --init runs/mini --lstm-init runs/mini-lstm --tasks sst2,cola \\
      --data-root ../shared/data --out analysis/ablations
  gpt1 analysis data-size --init runs/mini --task sst2 --data ../shared/data/glue/SST-2 \\
      --sizes 100,300,1000,all --seeds 0,1,2 --out analysis/data-size
"""
from __future__ import annotations

import argparse
import json

HELP = "layers transferred, ablations (with an LSTM), labelled-data curve, position embeddings"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)

    s = sub.add_parser("positions", help="2-D projection and cosine matrix of the position embeddings",
                       description="Project the learned position embeddings to 2-D (t-SNE, PCA "
                                   "fallback) coloured by position; plot their cosine similarity.")
    s.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint folder or run folder")
    s.add_argument("--out", default="analysis/positions", help="output folder")
    s.add_argument("--method", choices=["tsne", "pca"], default="tsne",
                   help="2-D projection (tsne falls back to pca when scikit-learn cannot run it)")
    s.add_argument("--max-positions", type=int, default=None,
                   help="only the first N positions (default: all)")
    s.add_argument("--seed", type=int, default=0, help="t-SNE random state")
    s.set_defaults(_parser=s)

    _add_sweep_commands(sub)


def _add_sweep_commands(sub: argparse._SubParsersAction) -> None:
    """layers, ablations, data-size: fine-tuning sweeps."""


def canonical_command(args: argparse.Namespace) -> list[str]:
    """The analysis command with every option spelled out (defaults included), for commands.txt."""
    parser: argparse.ArgumentParser = args._parser
    argv = ["gpt1", "analysis", args.analysis]
    for action in parser._actions:
        if action.dest in ("help", "debug", "quiet") or action.dest not in vars(args):
            continue
        value = getattr(args, action.dest)
        if not action.option_strings:
            argv.append(str(value))
        elif isinstance(action, argparse._StoreTrueAction):
            if value:
                argv.append(action.option_strings[0])
        elif value is not None:
            argv += [action.option_strings[0], str(value)]
    return argv


def run(args: argparse.Namespace) -> int:
    command = canonical_command(args)
    if args.analysis == "positions":
        from gpt1.analysis.positions import analyse_positions
        from gpt1.analysis.sweep import record_command

        record_command(args.out, command)
        summary = analyse_positions(args.checkpoint, args.out, method=args.method,
                                    max_positions=args.max_positions, seed=args.seed)
        print(json.dumps({k: summary[k] for k in ("method", "n_positions", "mean_cos_neighbours",
                                                  "mean_cos_distant", "nearest_within_2")}))
        print(f"wrote {args.out}/positions_2d.png, positions_cosine.png, positions.json")
        return 0
    from gpt1.analysis import runs

    return runs.run_sweep_command(args, command)
