"""A fine-tuning run described once (gpt1/recipes/commands.py): the recipe call and the recorded
`gpt1 finetune` command must mean the same run."""

from __future__ import annotations

import pytest

import gpt1.recipes.finetune as ft
from gpt1.cli import main
from gpt1.recipes.commands import FinetuneOptions, FinetuneRun


class _Stop(Exception):
    pass


def _captured_call(monkeypatch, run_call):
    """The (config, train config, out, spec, max-steps cap, ...) that `finetune` receives."""
    seen = {}

    def fake(
        cfg, train_cfg, out, spec=None, max_steps_cap=0, overwrite=False, command=None, inputs=()
    ):
        seen.update(
            cfg=cfg,
            train_cfg=train_cfg,
            out=str(out),
            spec=spec,
            cap=max_steps_cap,
            overwrite=overwrite,
            command=command,  # what the tracker runs record
            inputs=list(inputs),
        )
        raise _Stop

    monkeypatch.setattr(ft, "finetune", fake)
    with pytest.raises(_Stop):
        run_call()
    return seen


@pytest.mark.parametrize(
    "run",
    [
        FinetuneRun("sst2", "data/SST-2", "runs/mini", "runs/out", FinetuneOptions(), seed=3),
        FinetuneRun(
            "csv",
            "data/mine",
            "runs/mini",
            "runs/out a",
            seed=7,
            transfer_layers=-1,
            lm_coef=0.0,
            train_split="dev",
            eval_split="",
            train_examples=20,
            columns="text=sentence,label=label",
            labels="0,1",
            resume="auto",
            options=FinetuneOptions(
                max_steps=5,
                epochs=2.5,
                batch_size=8,
                micro_batch=4,
                lr=1e-4,
                n_ctx=64,
                precision="fp32",
                sets=["train.warmup=0.01", "finetune.clf_pdrop=0.2"],
                quiet=True,
                loggers=["tensorboard", "mlflow"],
            ),
        ),
    ],
)
def test_recorded_command_resolves_to_the_same_call(monkeypatch, run):
    direct = _captured_call(monkeypatch, run.run)
    argv = run.argv()
    assert argv[:2] == ["gpt1", "finetune"]
    via_cli = _captured_call(monkeypatch, lambda: main(argv[1:]))
    assert direct == via_cli
    assert direct["cfg"].task == run.task and direct["train_cfg"].seed == run.seed
    assert direct["command"].startswith("gpt1 finetune --task")
    if run.options.loggers:  # one tracker run per sub-run, as its own command line asks
        assert direct["train_cfg"].loggers == "jsonl,tensorboard,mlflow"


def test_options_flags_keep_their_order():
    run = FinetuneRun(
        "sst2",
        "d",
        "i",
        "o",
        FinetuneOptions(lr=0.001, sets=["train.warmup=0"]),
        seed=0,
        lm_coef=0.5,
    )
    assert run.argv() == [
        "gpt1",
        "finetune",
        "--task",
        "sst2",
        "--data",
        "d",
        "--init",
        "i",
        "--out",
        "o",
        "--seed",
        "0",
        "--lm-coef",
        "0.5",
        "--lr",
        "0.001",
        "--set",
        "train.warmup=0",
    ]
