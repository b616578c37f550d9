"""A training run is opened in one place (`gpt1.train.run.open_run`): the checkpoint a run
resumes from and the device it trains on are decided once per run, for pretraining and
fine-tuning alike, new and resumed; the opened run releases its folder's lock when it closes."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from gpt1 import devices, files
from gpt1.config import TrainConfig
from gpt1.errors import ConfigError
from gpt1.train import state as train_state
from gpt1.train.run import open_run
from helpers.tiny import char_vocab, make_corpus, make_task, run_cli, tiny_finetune, tiny_pretrain


def count_calls(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """Count the calls of `module.name`, wherever a gpt1 module has bound it (a module that
    imported the function by name holds its own reference). Returns the one-element counter."""
    original = getattr(module, name)
    calls = [0]

    def counted(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return original(*args, **kwargs)

    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("gpt1") and (
            getattr(loaded, name, None) is original
        ):
            monkeypatch.setattr(loaded, name, counted)
    return calls


@pytest.fixture
def counters(monkeypatch: pytest.MonkeyPatch) -> Callable[[], tuple[int, int]]:
    """`counters()`: (resume_checkpoint calls, resolve_device calls) since the last call."""
    import gpt1.recipes.finetune  # noqa: F401 - loaded, so its references are counted too
    import gpt1.recipes.pretrain  # noqa: F401
    import gpt1.train.loop  # noqa: F401

    checkpoints = count_calls(monkeypatch, train_state, "resume_checkpoint")
    resolved = count_calls(monkeypatch, devices, "resolve_device")

    def read() -> tuple[int, int]:
        seen = (checkpoints[0], resolved[0])
        checkpoints[0] = resolved[0] = 0
        return seen

    return read


def test_pretrain_decides_resume_and_device_once(tmp_path, counters):
    data, run = make_corpus(tmp_path / "data"), tmp_path / "run"
    assert run_cli(tiny_pretrain(data, run, 1)) == (0, "")
    assert counters() == (1, 1)  # a new run
    code, err = run_cli(tiny_pretrain(data, run, 2, "--resume", "auto"))
    assert code == 0, err
    assert counters() == (1, 1)  # the same run, resumed
    code, err = run_cli(tiny_pretrain(data, tmp_path / "b", 3, "--resume", str(run / "step-2")))
    assert code == 0, err
    assert counters() == (1, 1)  # a new run from another run's checkpoint


def test_finetune_decides_resume_and_device_once(tmp_path, counters):
    task, vocab, run = make_task(tmp_path / "task"), char_vocab(tmp_path / "vocab"), tmp_path / "ft"
    code, err = run_cli(tiny_finetune(task, vocab, run, 1, "--save-every", "1"))
    assert code == 0, err
    assert counters() == (1, 1)
    code, err = run_cli(tiny_finetune(task, vocab, run, 2, "--resume", "auto"))
    assert code == 0, err
    assert counters() == (1, 1)
    other = tiny_finetune(task, vocab, tmp_path / "b", 2, "--resume", str(run / "step-1"))
    code, err = run_cli(other)
    assert code == 0, err
    assert counters() == (1, 1)


def test_an_opened_run_holds_its_folder_until_it_closes(tmp_path):
    out = tmp_path / "run"
    with open_run(out, TrainConfig(device="cpu")) as opened:
        assert opened.resumed_from is None and opened.device.type == "cpu"
        assert opened.precision == "fp32" and opened.threads >= 1
        with pytest.raises(files.RunLocked), open_run(out, TrainConfig(device="cpu")):
            pass
    assert not out.exists()  # the lock wrote nothing that stays: it left nothing behind
    with open_run(out, TrainConfig(device="cpu")):  # free again
        pass


def test_a_refused_opening_leaves_no_folder(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="--resume"):
        with open_run(out, TrainConfig(device="cpu", resume=str(tmp_path / "nothing"))):
            pass
    with pytest.raises(ConfigError, match="precision"):
        with open_run(out, TrainConfig(device="cpu", precision="fp16")):
            pass
    assert not out.exists()
