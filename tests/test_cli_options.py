"""The flags several commands share (gpt1/cli/options.py) and their readers."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from gpt1.cli import main
from gpt1.cli.options import from_flags


@dataclass
class _Settings:
    seed: int = 0
    workers: int = 1
    out: str = "default-out"


def test_from_flags_takes_same_named_flags_keeps_defaults_and_given_wins():
    args = argparse.Namespace(
        seed=7, out="from-flag", threads=4
    )  # no --workers; --threads no field
    settings = from_flags(_Settings, args, out="given")
    assert settings == _Settings(seed=7, workers=1, out="given")


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_scoring_micro_batch_is_checked_before_the_run_is_read(command, tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    assert main([command, str(missing), "--micro-batch", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpt1 {command}: error: --micro-batch must be >= 1, got 0"
    assert not missing.exists()


def test_serve_takes_the_shared_precision_and_threads_flags():
    """serve's --precision is the shared flag with the precisions the server runs (no fp16),
    in the shared words, and its --threads is gpt1's one flag (unset: auto, applied by serve)."""
    from gpt1.cli import TAKES_THREADS, USES_THREADS, build_parser
    from gpt1.cli.options import precision_help
    from gpt1.cli.serve import PRECISIONS as SERVED
    from gpt1.devices import PRECISION_HELP, PRECISIONS
    from gpt1.serve.engine import PRECISIONS as ENGINE_PRECISIONS

    assert precision_help(PRECISIONS) == PRECISION_HELP  # one set of words for every command
    assert SERVED == ("auto", *ENGINE_PRECISIONS)
    parser = build_parser()
    assert parser.parse_args(["serve", "runs/x", "--precision", "int8"]).precision == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "runs/x", "--precision", "fp16"])
    serve = parser._subparsers._group_actions[0].choices["serve"]
    (precision,) = [a for a in serve._actions if a.dest == "precision"]
    assert precision.help == precision_help(SERVED) and "fp16" not in precision.help
    assert "serve" in TAKES_THREADS and "serve" not in USES_THREADS  # serve applies its own
    assert parser.parse_args(["serve", "runs/x"]).threads is None  # unset: auto (gpt1.threads)
