"""Print a model's config, parameter counts and training FLOPs per token, and a fine-tuned
checkpoint's task (name, kind, classes, window, metrics); with `--kernels`, which implementation
each kind of weight product and the decoding step use on this CPU, and why.

Examples:
  gpt1 info gpt1
  gpt1 info runs/mini/final --json
  gpt1 info runs/sst2                 # also the task, its labels and metrics
  gpt1 info --kernels                 # this CPU's kernels (builds nothing)
"""

from __future__ import annotations

import argparse
import json

HELP = "show a preset's or checkpoint's config, parameter count and FLOPs per token"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        metavar="PRESET|CHECKPOINT",
        nargs="?",
        help="a preset name (gpt1, mini, tiny) or a checkpoint / run folder",
    )
    p.add_argument(
        "--kernels",
        action="store_true",
        help="which implementation each weight product and the decoding step use on this CPU",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=None,
        help="context length for the attention FLOPs (default: n_positions)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from gpt1.errors import ConfigError
    from gpt1.recipes.info import describe, describe_kernels

    if args.model is None and not args.kernels:
        raise ConfigError("name a preset or checkpoint (or ask for --kernels)")
    kernels = describe_kernels() if args.kernels else None
    info = {} if args.model is None else describe(args.model, seq_len=args.seq_len)
    if args.json:
        print(json.dumps({**info, **(kernels or {})}))  # one object
        return 0
    if kernels is not None:
        print(_kernel_lines(kernels))
    if not info:
        return 0
    print(f"model: {info['source']}")
    for key, value in info["config"].items():
        print(f"  {key:20s} {value}")
    print(f"parameters:            {info['parameters']:,}")
    print(f"  without embeddings:  {info['parameters_without_embeddings']:,}")
    print(f"training FLOPs/token:  {info['flops_per_token']:.4g} (seq_len {info['seq_len']})")
    if "task" in info:
        print(_task_lines(info["task"]))
    return 0


def _task_lines(task: dict) -> str:
    """The fine-tuned task: name, kind, classes (and F1's), window, metrics, head size."""
    from gpt1.tasks.kinds import KINDS

    labels = task["labels"]
    if KINDS[task["kind"]].choice:
        outputs = "one score per answer"
    elif not labels:
        outputs = "regression (one score)"
    else:
        outputs = f"{len(labels)} classes: {', '.join(map(str, labels))}"
    lines = [
        f"task: {task['task']} ({task['kind']}, {outputs})",
        f"  n_ctx                {task['n_ctx']}",
        f"  metrics              {', '.join(task['metrics'])} (headline first)",
        f"  head parameters      {task['head_parameters']:,}",
    ]
    if "f1_label" in task:
        lines.insert(2, f"  F1 of class          {task['f1_label']}")
    if "columns" in task:
        roles = ", ".join(f"{k}={v}" for k, v in task["columns"].items())
        lines.insert(1, f"  columns              {roles}")
    return "\n".join(lines)


def _kernel_lines(kernels: dict) -> str:
    """One line per product kind: the implementation that runs it here, and why."""
    lines = [f"kernels on this CPU ({kernels['isa']}):"]
    for choice in kernels["kernels"]:
        lines.append(f"  {choice['kind']:20s} {choice['implementation']}")
        lines.append(f"  {'':20s}   {choice['why']}")
    return "\n".join(lines)
