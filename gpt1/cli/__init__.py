"""The `gpt1` command: argument parsing only. Each subcommand is a module `gpt1.cli.<name>` with
`HELP`, `add_arguments(parser)` and `run(args) -> int`; `run` calls a plain importable function.
A flag that several commands take is defined once, in `gpt1.cli.options`.

Only this package reads argv and configures logging. User mistakes (`Gpt1Error`) print as one line
and exit with status 2; `--debug` shows the full traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
import traceback
from typing import NoReturn

# Listed in the order `gpt1 --help` shows them. A module that is not present is not offered.
COMMANDS = [
    "demo",
    "info",
    "kernels",
    "convert",
    "sample",
    "tokenizer",
    "prepare",
    "pretrain",
    "plot",
    "finetune",
    "evaluate",
    "predict",
    "serve",
    "zeroshot",
    "lm-eval",
    "analysis",
]

# The commands that run torch take `--threads` (gpt1.threads), applied by `main` before they run.
# `serve` takes the same flag and applies it itself, after its own checks; `tokenizer` and
# `prepare` are plain Python (`prepare --workers` sets its processes); `info` and `plot` compute
# nothing.
USES_THREADS = frozenset(
    ["demo", "convert", "sample", "pretrain", "finetune", "evaluate", "predict", "zeroshot"]
    + ["lm-eval", "analysis"]
)
TAKES_THREADS = USES_THREADS | {"serve"}

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a malformed command line is one line on stderr (exit status 2), as every
    other refusal is, instead of the usage block followed by the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_value(self, action: argparse.Action, arg_string: str) -> object:
        """Every integer flag (`type=int`, any command) a 64-bit integer, signed or unsigned
        (-2**63..2**64-1): checked once here, as a malformed value is, since torch, numpy and
        the tokenizer trainer fail on wider ones with an OverflowError deep inside. Unsigned
        too, for the seeds torch's generators take (0..2**64-1); a setting is held to
        `gpt1.config.MAX_INT` where the config is validated."""
        value = super()._get_value(action, arg_string)
        if action.type is int and not -(2**63) <= value <= 2**64 - 1:
            raise argparse.ArgumentError(
                action, f"{arg_string} is out of range (a 64-bit integer, -2**63..2**64-1)"
            )
        return value


def build_parser() -> argparse.ArgumentParser:
    from gpt1.cli.options import common_options

    parser = OneLineParser(
        prog="gpt1",
        parents=[common_options()],
        description="GPT-1 (Radford et al., 2018): tokenize, pretrain, fine-tune, evaluate, sample.",
    )
    from gpt1 import __version__
    from gpt1.threads import add_threads_argument

    parser.add_argument("--version", action="version", version=f"gpt1 {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module_name = f"gpt1.cli.{name.replace('-', '_')}"
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        # A command that hands its other options on to another tool (lm-eval) must not have
        # them abbreviated into its own.
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            parents=[common_options()],
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=not getattr(module, "PASS_THROUGH", False),
        )
        module.add_arguments(p)
        if name in TAKES_THREADS:
            add_threads_argument(p)
        p.set_defaults(_run=module.run, _pass_through=getattr(module, "PASS_THROUGH", False))
    return parser


def configure_logging(debug: bool, quiet: bool) -> None:
    level = logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr, force=True)


def check_utf8(argv: list[str]) -> None:
    """Refuse, before anything runs, an argument that is not UTF-8 (Python hands such bytes on as
    lone surrogates): paths end up in UTF-8 files (safetensors headers, JSON), which refused
    them only after the work was done."""
    from gpt1.errors import ConfigError

    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"an argument is not valid UTF-8: {arg!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "_pass_through", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    # The command as typed, recorded with a run's experiment-tracker runs.
    args.argv = ["gpt1", *(sys.argv[1:] if argv is None else argv)]
    args.debug = getattr(args, "debug", False)
    args.quiet = getattr(args, "quiet", False)
    configure_logging(args.debug, args.quiet)
    from gpt1.errors import Gpt1Error

    try:
        check_utf8(args.argv[1:])
        if args.command in USES_THREADS:
            from gpt1.threads import apply_threads

            apply_threads(args.threads)
        code = int(args._run(args) or EXIT_OK)
        if args.command in USES_THREADS:
            from gpt1.threads import announce_now

            announce_now()
        return code
    except Gpt1Error as exc:
        if args.debug:
            traceback.print_exc()
        print(f"gpt1 {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # Output piped into `head` and friends: the reader left; that is not an error.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    except KeyboardInterrupt as exc:
        from gpt1.files import Terminated

        if isinstance(exc, Terminated):  # SIGTERM while a temporary was on disk (removed)
            print(f"gpt1 {args.command}: terminated", file=sys.stderr)
            return EXIT_TERMINATED
        print(f"gpt1 {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError:
        # Only the training commands have a micro-batch to lower; elsewhere the model or the
        # input itself is larger than this machine's memory.
        hint = (
            "lower --micro-batch (and raise gradient accumulation to keep the global batch)"
            if args.command in ("pretrain", "finetune")
            else "the model or input is larger than this machine's memory"
        )
        print(f"gpt1 {args.command}: error: out of memory; {hint}", file=sys.stderr)
        return EXIT_ERROR
