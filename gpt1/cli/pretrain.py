"""Pretrain GPT-1 on a `gpt1 prepare` folder or on text files (the paper's recipe with --preset gpt1).

Examples:
  gpt1 pretrain --preset mini --data data/novels --out runs/mini
  gpt1 pretrain --config configs/pretrain_gpt1.toml --data data/books --out runs/gpt1 --precision bf16
  gpt1 pretrain --preset mini --data data/novels --out runs/mini --resume auto
  gpt1 pretrain --preset mini --data 'books/*.jsonl' --tokenizer data/novels --max-steps 5000 --out runs/b
  torchrun --nproc_per_node 8 -m gpt1 pretrain --preset gpt1 --data data/books --out runs/gpt1

Settings resolve as preset -> --config TOML -> flags -> --set section.key=value. SIGINT/SIGTERM
write a checkpoint and exit; --resume auto continues bit-exactly from the newest one.
"""

from __future__ import annotations

import argparse
import shlex

HELP = "pretrain a GPT-1 language model on prepared token shards or text files"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    p.add_argument(
        "--preset",
        default=None,
        help="gpt1 (paper), mini (CPU) or tiny (tests); default: the TOML's `preset`, else gpt1",
    )
    options.add_config(p, "[model] [train] [data]")
    p.add_argument(
        "--data",
        metavar="PATH",
        help="output folder of `gpt1 prepare`, or .txt/.jsonl/.parquet files (a file, a folder "
        "or a quoted glob) read directly with --tokenizer",
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="tokenizer folder for text files read directly (same as --set data.tokenizer=...)",
    )
    p.add_argument(
        "--text-field",
        metavar="NAME",
        help="the .jsonl/.parquet field holding each document of text files read directly "
        "(default text; same as --set data.text_field=...)",
    )
    p.add_argument("--out", metavar="RUN", required=True, help="run folder (checkpoints, metrics)")
    p.add_argument(
        "--max-steps",
        type=int,
        help="optimizer updates (unset or 0: as many as train.epochs passes over the training "
        "split take, printed as the run starts)",
    )
    p.add_argument("--save-every", type=int, help="checkpoint every N steps")
    p.add_argument("--eval-every", type=int, help="validation every N steps (0: off)")
    p.add_argument("--log-every", type=int, help="console/metrics line every N steps")
    options.add_run_folder(p)
    p.add_argument("--micro-batch", type=int, help="sequences per forward pass per device")
    p.add_argument("--batch-size", type=int, help="global batch (sequences per update)")
    p.add_argument("--lr", type=float, help="peak learning rate")
    options.add_training_hardware(p)
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    p.add_argument(
        "--seed", type=int, help="initial weights, dropout and window order (default 1234)"
    )
    p.add_argument(
        "--arch",
        choices=["gpt", "lstm"],
        default="gpt",
        help="lstm: the paper's single-layer LSTM baseline, sized to match the preset's "
        "parameters (gpt1.model.lstm)",
    )
    options.add_settings(p, "any setting, e.g. --set train.warmup=500 --set model.n_layer=4")


def run(args: argparse.Namespace) -> int:
    from gpt1.cli import options
    from gpt1.recipes.pretrain import pretrain, resolve_config

    flags = {
        "data": {"path": args.data, "tokenizer": args.tokenizer, "text_field": args.text_field},
        "train": {
            "max_steps": args.max_steps,
            "save_every": args.save_every,
            "eval_every": args.eval_every,
            "log_every": args.log_every,
            "resume": args.resume,
            "micro_batch_size": args.micro_batch,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "precision": args.precision,
            "compile": args.compile,
            "seed": args.seed,
            "device": args.device,
            "quiet": True if args.quiet else None,
            "loggers": options.loggers_flag(args),
        },
    }
    cfg = resolve_config(args.preset, args.config, flags, args.set)
    inputs = [args.config] if args.config else []
    result = pretrain(
        cfg,
        args.out,
        arch=args.arch,
        overwrite=args.overwrite,
        command=shlex.join(args.argv),
        inputs=inputs,
    )
    if result.interrupted:
        return 128 + int(result.interrupted)
    return 0
