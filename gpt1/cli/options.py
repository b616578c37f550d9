"""The flags several subcommands share, each defined once here.

A command's `add_arguments` reads as the list of these groups and its own flags; where a group
feeds a recipe function, the reader next to it (`text_settings`, ...) turns the parsed flags back
into that function's keyword arguments, or `from_flags` fills the recipe's settings dataclass.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any, TypeVar

from gpt1.config import LOGGERS
from gpt1.devices import (
    DEVICE_HELP,
    PRECISION_HELP,
    PRECISIONS,
    TRAIN_PRECISION_HELP,
    TRAIN_PRECISIONS,
)

# A parser or one of its argument groups (`add_argument_group`): both take `add_argument`.
Flags = argparse.ArgumentParser | argparse._ArgumentGroup
T = TypeVar("T")


def common_options() -> argparse.ArgumentParser:
    """Options every subcommand accepts (also before the subcommand name)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show full tracebacks and debug logging",
    )
    parent.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        default=argparse.SUPPRESS,
        help="only warnings and errors; no progress bars",
    )
    return parent


def from_flags(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """A settings dataclass whose fields are named after a command's flags, filled from them:
    `given` fields as given, the others from the flag of that name, or cls's default if none."""
    flags = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    return cls(**{**flags, **given})


def add_number(p: Flags, flag: str, default: int | float, help: str) -> None:
    """A number flag (of `default`'s type) whose help ends with its default, so that the two
    never disagree: `add_number(p, "--micro-batch", 16, "examples per forward pass")` -> help
    "examples per forward pass (default 16)"."""
    p.add_argument(flag, type=type(default), default=default, help=f"{help} (default {default})")


def add_source(p: Flags, dest: str, metavar: str, help: str) -> None:
    """The positional naming what a command reads (a run, checkpoint or preset)."""
    p.add_argument(dest, metavar=metavar, help=help)


def add_overwrite(p: Flags, what: str) -> None:
    """The one `--overwrite` flag: without it no command replaces what it did not create."""
    p.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace {what} (without it an existing output is refused)",
    )


def add_config(p: Flags, tables: str) -> None:
    """The one `--config FILE.toml` of the commands that resolve a config (`tables`: its tables)."""
    p.add_argument("--config", metavar="FILE.toml", help=f"TOML with {tables} tables")


def add_settings(p: Flags, help: str) -> None:
    """The one repeatable `--set SECTION.KEY=VALUE` of the commands that resolve a config."""
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help=help)


# --- training (pretrain, finetune, the analysis sweeps' sub-runs) ---------------------------


def add_logger(p: Flags) -> None:
    """The one repeatable `--logger` flag of the training commands (train.loggers)."""
    p.add_argument(
        "--logger",
        action="append",
        choices=LOGGERS,
        metavar="NAME",
        help=f"also send metrics to a tracker, repeatable: {', '.join(LOGGERS[1:])} (jsonl, "
        "metrics.jsonl, is always written; extra `track`); see docs/commands/pretrain.md",
    )


def loggers_flag(args: argparse.Namespace) -> str | None:
    """`--logger` values as the train.loggers setting (None when the flag was not given)."""
    return ",".join(["jsonl", *args.logger]) if getattr(args, "logger", None) else None


def add_run_folder(p: Flags) -> None:
    """What a training run does with its --out: continue it, start it over, also report it."""
    p.add_argument(
        "--resume",
        metavar="auto|PATH",
        help="continue from the newest checkpoint in --out (auto) or from a step-N folder",
    )
    add_overwrite(p, "a non-empty --out: delete its contents and start over")
    add_logger(p)


def add_training_hardware(p: Flags) -> None:
    """--precision and --device of a training run (unset: the config's)."""
    p.add_argument("--precision", choices=TRAIN_PRECISIONS, help=TRAIN_PRECISION_HELP)
    p.add_argument("--device", help=DEVICE_HELP + " (same as --set train.device=...)")


def add_finetune_schedule(p: Flags, max_steps_help: str) -> None:
    """How long and in what batches fine-tuning runs (unset: fine-tuning's own defaults)."""
    p.add_argument("--max-steps", type=int, help=max_steps_help)
    p.add_argument("--epochs", type=float, help="passes over the training split (default 3)")
    p.add_argument("--micro-batch", type=int, help="examples per forward pass (accumulation)")
    p.add_argument("--batch-size", type=int, help="examples per update (default 32)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 6.25e-5)")
    p.add_argument("--n-ctx", type=int, help="longest sequence (default: the model's n_positions)")


# --- inference (sample, evaluate, predict, zeroshot) ----------------------------------------


def add_device(p: Flags) -> None:
    """The one --device flag of a command that loads a checkpoint."""
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def add_inference_hardware(p: Flags, precisions: tuple[str, ...] = PRECISIONS) -> None:
    """--device and --precision of a loaded checkpoint, both `auto` by default (`precisions`:
    those the command runs, where it runs fewer than `gpt1.devices.PRECISIONS`)."""
    add_device(p)
    help = PRECISION_HELP if precisions == PRECISIONS else precision_help(precisions)
    p.add_argument("--precision", default="auto", choices=precisions, help=help)


# What a precision means, in the words of `gpt1.devices.PRECISION_HELP` (for a subset of them).
PRECISION_WORDS = {
    "auto": "auto (default: bf16 on a GPU that supports it, fp32 otherwise)",
    "int8": "int8 (CPU: int8 weights, bf16 activations)",
}


def precision_help(precisions: tuple[str, ...]) -> str:
    """`--precision`'s help for these precisions: `a, b or c`, each in its words."""
    words = [PRECISION_WORDS.get(name, name) for name in precisions]
    return ", ".join(words[:-1]) + " or " + words[-1]


def add_scoring(p: Flags, split_help: str) -> None:
    """The options `evaluate` and `predict` share: which run, which data, how to run it."""
    p.add_argument("run", metavar="RUN", help="fine-tuned run or checkpoint folder")
    p.add_argument("--task", help="task name (checked against the run's task)")
    p.add_argument("--data", metavar="DIR", help="folder with the task's files (or --file)")
    p.add_argument(
        "--file",
        metavar="PATH",
        help="one file in the task's format instead of --data: a split named after its "
        "stem (held_out.csv -> held_out)",
    )
    p.add_argument("--split", help=split_help + "; any name is looked up as NAME.<ext>")
    add_number(p, "--micro-batch", 16, "examples per forward pass")
    add_inference_hardware(p)
    p.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip malformed rows (counted and reported) instead of stopping; a label outside "
        "the task's set still stops",
    )
    add_overwrite(p, "an existing output file")


def add_sampling(p: Flags) -> None:
    """How a continuation is drawn: the fields of `gpt1.inference.sampling.Sampling`, one flag each."""
    add_number(p, "--max-new-tokens", 50, "tokens to generate")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default: 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, in (0, 1]")
    p.add_argument(
        "--seed", type=int, default=None, help="random seed, 0..2**64-1 (default: random)"
    )


def sampling_settings(args: argparse.Namespace) -> Any:
    """`add_sampling`'s flags as a `Sampling`, checked before anything loads; a refusal names the
    flag (`--top-p must be ...`)."""
    from gpt1.inference.sampling import Sampling, SamplingError

    try:
        return from_flags(Sampling, args)
    except SamplingError as exc:
        raise exc.flag() from None


# --- text (tokenizer, prepare) --------------------------------------------------------------


def add_corpus(p: Flags, help: str) -> None:
    """The one `--corpus PATH...` of the commands that read a text corpus."""
    p.add_argument("--corpus", nargs="+", required=True, metavar="PATH", help=help)


def add_corpus_fields(p: Flags) -> None:
    """Where a corpus file keeps its text."""
    p.add_argument("--text-field", default="text", help="text field of .jsonl and .parquet rows")
    p.add_argument(
        "--strip-gutenberg",
        action="store_true",
        help="keep only the text between Project Gutenberg START/END markers",
    )


def add_standardize(p: Flags, help_names_default: bool = True) -> None:
    """Which text standardisation the GPT-1 pipeline applies (`prepare`'s help leaves out the
    default, the tokenizer's names it)."""
    p.add_argument(
        "--standardize",
        choices=["oai", "hf"],
        default="oai",
        help="oai: backslashes not padded (original); hf: padded"
        + (" (default oai)" if help_names_default else ""),
    )


def add_oai_lowercase(p: Flags) -> None:
    """OAI's order of lowercasing and tokenizing instead of transformers' (`text_settings`)."""
    p.add_argument(
        "--oai-lowercase",
        action="store_true",
        help="lowercase spaCy's tokens like OAI's code (\"Mr.\" stays one token) "
        "instead of the raw text first like transformers",
    )


def text_settings(args: argparse.Namespace) -> dict:
    """--standardize and --oai-lowercase (absent: off) as the tokenizer's keyword arguments."""
    return dict(standardize=args.standardize, lower_first=not getattr(args, "oai_lowercase", False))


def corpus_settings(args: argparse.Namespace) -> dict:
    """`add_corpus_fields`' flags and `text_settings`, as `PrepareOptions` fields."""
    return dict(
        text_field=args.text_field, strip_gutenberg=args.strip_gutenberg, **text_settings(args)
    )
