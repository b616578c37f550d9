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
    from gpt1.devices import PRECISION_HELP, PRECISIONS
    from gpt1.devices import SERVE_PRECISIONS as SERVED

    assert precision_help(PRECISIONS) == PRECISION_HELP  # one set of words for every command
    parser = build_parser()
    assert parser.parse_args(["serve", "runs/x", "--precision", "int8"]).precision == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "runs/x", "--precision", "fp16"])
    serve = parser._subparsers._group_actions[0].choices["serve"]
    (precision,) = [a for a in serve._actions if a.dest == "precision"]
    assert precision.help == precision_help(SERVED) and "fp16" not in precision.help
    assert "serve" in TAKES_THREADS and "serve" not in USES_THREADS  # serve applies its own
    assert parser.parse_args(["serve", "runs/x"]).threads is None  # unset: auto (gpt1.threads)


@pytest.mark.parametrize(
    "argv",
    [
        ["tokenizer", "train", "--corpus", "c.txt", "--merges", "1" + "0" * 30],
        ["finetune", "--task", "sst2", "--data", "d", "--init", "none", "--batch-size", "1e30"],
        "finetune --task sst2 --data d --init none --max-steps".split() + ["-" + "9" * 20],
        ["demo", "--seed", "1" + "0" * 30],
    ],
)
def test_every_integer_flag_is_refused_past_64_bits_before_anything_runs(
    argv, tmp_path, capsys, monkeypatch
):
    """One check in the parser for every `type=int` flag: torch, numpy and the tokenizer trainer
    failed on 10^30 with an OverflowError traceback deep inside."""
    argv = [a.replace("1e30", "1" + "0" * 30) for a in argv]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--out", "out"])
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and len(err.splitlines()) == 1
    assert f"argument {argv[-2]}: " in err and "out of range" in err
    assert list(tmp_path.iterdir()) == []


def test_integer_flags_within_64_bits_parse_as_before():
    from gpt1.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["demo", "--pretrain-steps", str(2**63 - 1), "--seed", "-5"])
    assert args.pretrain_steps == 2**63 - 1 and args.seed == -5  # a seed's range is the recipe's
    assert (
        parser.parse_args(["sample", "x", "--prompt", "hi", "--seed", str(2**64 - 1)]).seed
        == 2**64 - 1
    )
    with pytest.raises(SystemExit):  # past what torch's generators take
        parser.parse_args(["sample", "x", "--prompt", "hi", "--seed", str(2**64)])


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_demo_refuses_a_seed_outside_0_to_2_32_before_writing(seed, tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--seed", seed]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"gpt1 demo: error: --seed must be in 0..2**32-1 (4294967295), got {seed}"
    assert not out.exists()
