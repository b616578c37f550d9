"""The paper's analyses and two beyond it. Each writes into --out, records its exact commands in
OUT/commands.txt and, for sweeps, its finished sub-runs in OUT/sweep.json: run the same command
again after an interruption and it continues where it stopped.

Examples:
  gpt1 analysis positions runs/mini --out analysis/positions
  gpt1 analysis layers --init runs/mini --task sst2 --data data/glue/SST-2 --out analysis/layers
  gpt1 analysis ablations --init runs/mini --lstm-init runs/mini-lstm --tasks sst2,cola \\
      --data-root data --out analysis/ablations
  gpt1 analysis data-size --init runs/mini --task sst2 --data data/glue/SST-2 \\
      --sizes 100,300,1000,all --seeds 0,1,2 --out analysis/data-size
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

HELP = "layers transferred, ablations (with an LSTM), labelled-data curve, position embeddings"


# Each analysis: its one-line help and its description (`add_arguments` adds its options).
ANALYSES = {
    "positions": (
        "2-D projection and cosine matrix of the position embeddings",
        "Project the learned position embeddings to 2-D (t-SNE, PCA "
        "fallback) coloured by position; plot their cosine similarity.",
    ),
    "layers": (
        "Fig. 2 left: fine-tune with embeddings + K pretrained blocks",
        "Fine-tune with the embeddings plus K = 0..n_layer pretrained "
        "blocks; plot dev (solid) and train (dashed) metric against K.",
    ),
    "ablations": (
        "Table 5: full / no pretraining / no aux LM / LSTM",
        "Fine-tune each task four ways (Table 5) and write the table "
        "with an Avg column in the paper's layout.",
    ),
    "data-size": (
        "dev metric against labelled examples, with and without pretraining",
        "Fine-tune on seeded subsets of the training "
        "split with and without pretraining; plot dev metric against examples.",
    ),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    add_options = {
        "positions": _positions_options,
        "layers": _layers_options,
        "ablations": _ablations_options,
        "data-size": _data_size_options,
    }
    for name, (help_, description) in ANALYSES.items():
        s = sub.add_parser(name, help=help_, description=description)
        add_options[name](s)
        s.set_defaults(_parser=s)  # canonical_command reads its options


def _positions_options(s: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    s.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint folder or run folder")
    _add_out(s)
    s.add_argument(
        "--method",
        choices=["tsne", "pca"],
        default="tsne",
        help="2-D projection (tsne falls back to pca when scikit-learn cannot run it)",
    )
    s.add_argument(
        "--max-positions", type=int, default=None, help="only the first N positions (default: all)"
    )
    s.add_argument("--seed", type=int, default=0, help="t-SNE random state")
    options.add_overwrite(s, "existing positions_2d.png, positions_cosine.png, positions.json")


# layers, ablations, data-size: sweeps of `gpt1 finetune` sub-runs.


def _layers_options(s: argparse.ArgumentParser) -> None:
    _init_task_data(s)
    s.add_argument("--ks", help="K values, e.g. 0,3,6 (default: 0..n_layer)")
    _add_seeds(s)
    s.add_argument(
        "--train-eval-examples",
        type=int,
        default=1000,
        help="train metric on at most this many training examples (fixed sample)",
    )
    _splits_and_subset(s)
    _finetune_options(s)


def _ablations_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--init", required=True, metavar="CHECKPOINT", help="pretrained GPT checkpoint")
    s.add_argument(
        "--lstm-init",
        metavar="CHECKPOINT",
        help="LSTM pretrained on the same corpus "
        "(gpt1 pretrain --arch lstm); without it the LSTM row is left out",
    )
    s.add_argument("--tasks", required=True, help="comma-separated task names, e.g. sst2,cola,stsb")
    s.add_argument(
        "--data-root",
        required=True,
        metavar="DIR",
        help="folder holding each task in glue/SST-2, glue/CoLA, snli, scitail, story_cloze, ...",
    )
    s.add_argument(
        "--task-data",
        action="append",
        default=[],
        metavar="TASK=DIR",
        help="a task's folder (absolute, or relative to --data-root)",
    )
    s.add_argument(
        "--splits",
        action="append",
        default=[],
        metavar="TASK=TRAIN:EVAL",
        help="train and scored splits of a task (default train:dev), e.g. "
        "scitail=dev:test for data that has no train split",
    )
    _add_seeds(s)
    s.add_argument(
        "--rows",
        help="run only these rows: full,scratch,no_aux,lstm (default: all; "
        "the table shows every row with results in --out)",
    )
    _add_train_examples(s)
    _add_out(s)
    _finetune_options(s)


def _data_size_options(s: argparse.ArgumentParser) -> None:
    _init_task_data(s)
    s.add_argument(
        "--sizes",
        default="100,300,1000,3000,10000,all",
        help="training-set sizes; all = the whole split",
    )
    s.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    s.add_argument("--train-split", default="train", help="split the subsets are drawn from")
    s.add_argument("--eval-split", default="dev", help="split scored (default dev)")
    _finetune_options(s)


def _init_task_data(s: argparse.ArgumentParser) -> None:
    s.add_argument("--init", required=True, metavar="CHECKPOINT", help="pretrained checkpoint")
    s.add_argument("--task", required=True, help="task name (see gpt1 finetune --help)")
    s.add_argument("--data", required=True, metavar="DIR", help="the task's folder")
    _add_out(s)


def _add_out(s: argparse.ArgumentParser) -> None:
    """--out, by default analysis/NAME."""
    s.add_argument("--out", default=f"analysis/{s.prog.split()[-1]}", help="output folder")


def _add_seeds(s: argparse.ArgumentParser) -> None:
    s.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")


def _add_train_examples(s: argparse.ArgumentParser) -> None:
    s.add_argument("--train-examples", type=int, help="train on a seeded subset of this size")


def _splits_and_subset(s: argparse.ArgumentParser) -> None:
    s.add_argument("--train-split", default="train", help="split to train on (default train)")
    s.add_argument("--eval-split", default="dev", help="split scored (default dev)")
    _add_train_examples(s)


def _finetune_options(s: argparse.ArgumentParser) -> None:
    """Passed to every `gpt1 finetune` sub-run (default: fine-tuning's own defaults)."""
    from gpt1.cli import options
    from gpt1.devices import TRAIN_PRECISIONS

    g = s.add_argument_group("fine-tuning options for every sub-run")
    options.add_finetune_schedule(g, "optimizer updates per sub-run (finetune --max-steps)")
    g.add_argument(
        "--precision",
        choices=TRAIN_PRECISIONS,
        help="auto (default: bf16 autocast on a GPU that supports it, fp32 otherwise), "
        "fp32 or bf16",
    )
    options.add_settings(g, "passed to every sub-run, e.g. --set finetune.clf_pdrop=0.2")
    options.add_logger(g)  # one tracker run per sub-run


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
        elif isinstance(action, argparse._AppendAction):
            for item in value or []:
                argv += [action.option_strings[0], str(item)]
        elif value is not None:
            argv += [action.option_strings[0], str(value)]
    return argv


def analysis_inputs(args: argparse.Namespace) -> list[Path]:
    """What an analysis reads: its checkpoints' files and its data folders' (never replaced:
    `gpt1.files.check_inputs`)."""
    from gpt1.checkpoint_files import resolve_checkpoint_dir
    from gpt1.errors import Gpt1Error
    from gpt1.files import folder_files

    found: list[Path] = []
    for name in ("checkpoint", "init", "lstm_init"):
        value = getattr(args, name, None)
        if value and value != "none":
            try:
                found += folder_files(resolve_checkpoint_dir(value))
            except Gpt1Error:
                found.append(Path(value))
    for name in ("data", "data_root"):
        found += folder_files(getattr(args, name, None))
    return found


def run(args: argparse.Namespace) -> int:
    from gpt1.files import check_inputs

    command = canonical_command(args)
    roots = [
        getattr(args, n, None) for n in ("checkpoint", "init", "lstm_init", "data", "data_root")
    ]
    check_inputs(args.out, analysis_inputs(args), roots)  # before commands.txt or a run is written
    if args.analysis == "positions":
        from gpt1.analysis.positions import analyse_positions, check_positions_out
        from gpt1.analysis.sweep import record_command

        check_positions_out(args.out, args.overwrite)
        summary = analyse_positions(
            args.checkpoint,
            args.out,
            method=args.method,
            max_positions=args.max_positions,
            seed=args.seed,
        )
        print(
            json.dumps(
                {
                    k: summary[k]
                    for k in (
                        "method",
                        "n_positions",
                        "mean_cos_neighbours",
                        "mean_cos_distant",
                        "nearest_within_2",
                    )
                }
            )
        )
        record_command(args.out, command)  # once it ran: a refused analysis writes nothing
        print(f"wrote {args.out}/positions_2d.png, positions_cosine.png, positions.json")
        return 0
    with _undone_if_refused(Path(args.out)):
        return _run_sweep(args, command)


@contextlib.contextmanager
def _undone_if_refused(out: Path) -> Iterator[None]:
    """A sweep refused before it finished any sub-run (an unknown task, unreadable data, a
    checkpoint that cannot load) leaves `out` as it found it: the folders, commands.txt and
    sweep.json it made are removed. A sweep that had finished sub-runs keeps them (a later
    invocation resumes it), as does a folder that already held a sweep."""
    from gpt1 import files
    from gpt1.analysis.sweep import SWEEP_FILE
    from gpt1.errors import Gpt1Error

    if (out / SWEEP_FILE).is_file():  # a sweep's own folder, resumed: nothing to undo
        yield
        return
    top = out  # the highest folder this command may create
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    existed = files.entries(out)
    try:
        yield
    except Gpt1Error:
        if not _finished_runs(out / SWEEP_FILE):
            if top == out:
                files.remove_new(out, existed)
            else:  # folders above `out` made for it
                shutil.rmtree(top, ignore_errors=True)
        raise


def _finished_runs(sweep_file: Path) -> bool:
    try:
        return bool(json.loads(sweep_file.read_text()).get("runs"))
    except (OSError, ValueError, AttributeError):
        return False


def _run_sweep(args: argparse.Namespace, command: list[str]) -> int:
    from gpt1.analysis.runs import FinetuneOptions, TaskSweep, parse_ints
    from gpt1.cli.options import from_flags
    from gpt1.config import check_seed

    sets, loggers = list(args.set), list(args.logger or [])
    options = from_flags(FinetuneOptions, args, sets=sets, loggers=loggers)
    seeds = parse_ints(args.seeds, "--seeds")
    for seed in seeds:  # before any sub-run starts (each would refuse it as train.seed)
        check_seed(seed, "--seeds")
    if args.analysis != "ablations":  # one task: what its sub-runs hold fixed
        task = TaskSweep(
            args.init, args.task, args.data, args.train_split, args.eval_split, options
        )
    if args.analysis == "layers":
        from gpt1.analysis.layers import layers_sweep, markdown

        ks = parse_ints(args.ks, "--ks") if args.ks else None
        table = layers_sweep(
            task,
            args.out,
            seeds,
            ks,
            args.train_examples,
            args.train_eval_examples,
            command,
        )
        print(markdown(table), end="")
        print(f"wrote {args.out}/layers.png, layers.md, layers.json")
    elif args.analysis == "ablations":
        from gpt1.analysis.ablations import (
            Ablations,
            ablation_sweep,
            markdown,
            parse_mapping,
            task_plan,
        )

        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
        folders = parse_mapping(args.task_data, "--task-data")
        splits = parse_mapping(args.splits, "--splits")
        rows = [r.strip() for r in args.rows.split(",") if r.strip()] if args.rows else None
        plan = task_plan(tasks, args.data_root, folders, splits)
        ablations = from_flags(Ablations, args, plan=plan, options=options)
        table = ablation_sweep(ablations, args.out, seeds, command, rows)
        print(markdown(table, args.lstm_init is not None), end="")
        print(f"wrote {args.out}/ablations.md, ablations.json")
    else:
        from gpt1.analysis.data_size import data_size_sweep, markdown, parse_sizes

        table = data_size_sweep(task, args.out, parse_sizes(args.sizes), seeds, command)
        print(markdown(table), end="")
        print(f"wrote {args.out}/data_size.png, data_size.md, data_size.json")
    return 0
