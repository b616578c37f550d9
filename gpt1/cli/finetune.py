"""Fine-tune a GPT-1 checkpoint on a task with the paper's input transformations (§3.3).

Examples:
  gpt1 finetune --task sst2 --data glue/SST-2 --init runs/mini --out runs/sst2
  gpt1 finetune --task story_cloze --data data/story_cloze --init runs/gpt1 --out runs/roc
  gpt1 finetune --task cola --data glue/CoLA --init none --preset mini --vocab runs/mini/final --out runs/cola-scratch
  gpt1 finetune --task scitail --data scitail --init runs/mini --train-split dev --eval-split test --out runs/sci
  gpt1 finetune --task csv --columns text=review,label=stars --data mydata --init runs/mini --out runs/mine
  torchrun --nproc_per_node 4 -m gpt1 finetune --task mnli --data glue/MNLI --init runs/gpt1 --out runs/mnli

Defaults are the paper's: lr 6.25e-5, batch 32, 3 epochs, warm-up over 0.2% then linear decay,
lambda = 0.5, classifier dropout 0.1. Settings resolve as defaults -> --config TOML ([finetune]
and [train] tables) -> flags -> --set section.key=value. After training the run is scored on
--eval-split and results.json is written into --out.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

HELP = "fine-tune on a task (classification, entailment, similarity, multiple choice)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    _add_task_and_start(p)
    options.add_finetune_schedule(
        p,
        "optimizer updates, as in pretrain (same as --set "
        "train.max_steps=N; default 0: (examples // batch) x epochs)",
    )
    p.add_argument("--eval-every", type=int, help="score the eval split every N steps")
    p.add_argument("--save-every", type=int, help="resumable checkpoint every N steps")
    options.add_run_folder(p)
    p.add_argument(
        "--seed",
        type=int,
        help="head and task-token init, dropout, shuffling and "
        "--train-examples subset (default 42)",
    )
    options.add_training_hardware(p)
    _add_examples(p)
    options.add_settings(
        p, "any setting, e.g. --set train.warmup=0.01 --set finetune.clf_pdrop=0.2"
    )
    p.add_argument("--json", action="store_true", help="print results.json as the last line")


def _add_task_and_start(p: argparse.ArgumentParser) -> None:
    """The task, its data, the run folder and what the model starts from."""
    from gpt1.cli import options
    from gpt1.tasks.registry import GENERIC, TASKS

    p.add_argument("--task", help=f"task name ({', '.join(TASKS)}) or {'/'.join(GENERIC)}")
    p.add_argument("--data", metavar="DIR", help="folder with the task's files (or hf:NAME)")
    p.add_argument("--init", metavar="CHECKPOINT|none", help="pretrained checkpoint, or none")
    p.add_argument("--out", metavar="RUN", required=True, help="run folder")
    options.add_config(p, "[finetune] and [train]")
    p.add_argument("--preset", help="model size with --init none (gpt1, mini, tiny)")
    p.add_argument("--vocab", metavar="DIR", help="tokenizer folder (needed with --init none)")
    p.add_argument(
        "--lm-coef", type=float, help="auxiliary LM weight lambda (default 0.5; 0 = off)"
    )
    p.add_argument(
        "--transfer-layers",
        type=int,
        metavar="K",
        help="embeddings + first K blocks from the checkpoint; -1 = nothing (default: all)",
    )


def _add_examples(p: argparse.ArgumentParser) -> None:
    """Which examples train and which are scored, how they are batched, and how a task of the
    user's own csv/tsv/jsonl files reads them (`generic_spec`)."""
    p.add_argument("--train-split", help="split to train on (default train)")
    p.add_argument("--eval-split", help="split scored after training (default dev; '' = none)")
    p.add_argument(
        "--train-examples",
        type=int,
        metavar="N",
        help="train on a random subset of N training examples (chosen by --seed)",
    )
    p.add_argument(
        "--group-by-length",
        action="store_true",
        default=None,
        help="batch examples of similar length (far less padding, faster; the paper "
        "shuffled freely, so off by default)",
    )
    p.add_argument(
        "--skip-bad-rows",
        action="store_true",
        default=None,
        help="skip malformed rows (counted and reported) instead of stopping; a label outside "
        "the task's set still stops",
    )
    p.add_argument(
        "--columns",
        metavar="ROLE=COL,...",
        help="csv/tsv/jsonl tasks: text=, a=, b=, context=, question=, choices=C1|C2, label=, id=",
    )
    p.add_argument(
        "--labels", metavar="L1,L2,...", help="csv/tsv/jsonl tasks: class names in order"
    )
    p.add_argument(
        "--positive-label",
        metavar="LABEL",
        help="csv/tsv/jsonl two-class tasks: the class F1 is computed for (default: the "
        "second class, e.g. pos of neg,pos)",
    )
    p.add_argument("--regression", action="store_true", help="csv/tsv/jsonl tasks: float labels")
    p.add_argument(
        "--similarity",
        action="store_true",
        help="csv/tsv/jsonl pair tasks: use the similarity transformation (both orders)",
    )


def generic_spec(args: argparse.Namespace) -> dict | None:
    from gpt1.errors import ConfigError
    from gpt1.tasks.generic import spec_from_flags

    if args.positive_label is not None and not args.columns:
        raise ConfigError(
            "--positive-label is for csv/tsv/jsonl tasks (with --columns); a registered "
            "task's F1 class is fixed (MRPC, QQP: 1)"
        )
    return spec_from_flags(
        args.columns, args.labels, args.regression, args.similarity, args.positive_label
    )


def run(args: argparse.Namespace) -> int:
    from gpt1.cli import options
    from gpt1.recipes.finetune import finetune, resolve

    flags = {
        "finetune": {
            "task": args.task,
            "data": args.data,
            "init": args.init,
            "preset": args.preset,
            "vocab": args.vocab,
            "lm_coef": args.lm_coef,
            "transfer_layers": args.transfer_layers,
            "n_ctx": args.n_ctx,
            "train_split": args.train_split,
            "eval_split": args.eval_split,
            "skip_bad_rows": args.skip_bad_rows,
            "train_examples": args.train_examples,
            "group_by_length": args.group_by_length,
        },
        "train": {
            "max_steps": args.max_steps,
            "epochs": args.epochs,
            "micro_batch_size": args.micro_batch,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "eval_every": args.eval_every,
            "save_every": args.save_every,
            "resume": args.resume,
            "seed": args.seed,
            "precision": args.precision,
            "device": args.device,
            "quiet": True if args.quiet else None,
            "loggers": options.loggers_flag(args),
        },
    }
    cfg, train_cfg = resolve(args.config, flags, args.set)
    result, results = finetune(
        cfg,
        train_cfg,
        args.out,
        generic_spec(args),
        overwrite=args.overwrite,
        command=shlex.join(args.argv),
        inputs=[args.config] if args.config else [],
    )
    if result.interrupted:
        return 128 + int(result.interrupted)
    if results and args.json:
        print(json.dumps(results))
        return 0
    if results:
        print(results_summary(results))
    final = getattr(result, "final_dir", None)
    wrote = [f"{final} (fine-tuned model)"] if final else []
    if results:
        wrote.append(f"{Path(args.out) / 'results.json'}")
    if wrote:
        print("wrote " + ", ".join(wrote))
    return 0


def results_summary(results: dict) -> str:
    """`task split (n=N): metric value, ...`; F1 names its class, the headline comes first."""
    f1_of = f" (class {results['f1_label']!r})" if results.get("f1_label") else ""
    metrics = ", ".join(
        f"{k} {v:.4f}" + (f1_of if k == "f1" else "")
        for k, v in results.items()
        if isinstance(v, float) and k not in ("n",)
    )
    return f"{results['task']} {results['split']} (n={results['n']}): {metrics}"
