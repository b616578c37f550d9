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
