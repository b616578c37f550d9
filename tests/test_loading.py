"""One loader: `open_checkpoint` reads a checkpoint folder once, `load_for_inference` builds every
inference command's model from it (a pretrained GPT, a fine-tuned run, the LSTM baseline)."""

from __future__ import annotations

import builtins
import io
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from gpt1 import checkpoint_files
from gpt1.checkpoint_files import CheckpointFolder, open_checkpoint
from gpt1.errors import CheckpointError
from gpt1.inference.loading import load_for_inference
from gpt1.inference.prepared import for_inference
from gpt1.model.checkpoint import load_model
from gpt1.model.gpt import GPT
from gpt1.model.heads import FinetuneModel
from gpt1.model.lstm import LSTMLM, LSTMConfig
from gpt1.model.registry import save_lstm
from helpers.tiny import char_vocab, tiny_checkpoint, tiny_finetuned_run


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Counts of what a load does: calls of `resolve_checkpoint_dir` (through every module that
    imported it) and openings of config.json, task.json and run.json for reading."""
    counts: Counter = Counter()
    real_resolve = checkpoint_files.resolve_checkpoint_dir

    def resolve(path):
        counts["resolve_checkpoint_dir"] += 1
        return real_resolve(path)

    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "") or "").startswith("gpt1") and (
            getattr(module, "resolve_checkpoint_dir", None) is real_resolve
        ):
            monkeypatch.setattr(module, "resolve_checkpoint_dir", resolve)
    real_open = builtins.open

    def counting_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, Path)) and "r" in mode:
            counts[Path(file).name] += 1
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    return counts


def lstm_checkpoint(folder: Path) -> Path:
    torch.manual_seed(0)
    vocab = char_vocab(folder.parent / "vocab")
    size = len(json.loads((vocab / "vocab.json").read_text()))
    config = LSTMConfig(vocab_size=size, n_embd=16, hidden_size=32, n_positions=24)
    return save_lstm(LSTMLM(config), folder, vocab)


def test_a_pretrained_run_is_resolved_and_its_config_parsed_once(tmp_path, counted):
    tiny_checkpoint(tmp_path / "run" / "final")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"data": {"n_ctx": 16}}))
    counted.clear()  # writing a checkpoint reopens its files (fsync)
    loaded = load_for_inference(tmp_path / "run", "cpu", "fp32")
    assert counted["resolve_checkpoint_dir"] == 1
    assert counted["config.json"] == 1 and counted["run.json"] == 1
    assert isinstance(loaded.model, GPT) and loaded.lm is loaded.model
    assert loaded.task is None and loaded.record is None and loaded.tokenizer is not None
    assert loaded.checkpoint.folder == tmp_path / "run" / "final"
    assert loaded.window == 16 and loaded.precision == "fp32" and not loaded.model.training


def test_a_finetuned_run_is_resolved_and_its_files_parsed_once(tmp_path, counted):
    run, _ = tiny_finetuned_run(tmp_path)
    counted.clear()
    loaded = load_for_inference(run, "cpu", "fp32")
    assert counted["resolve_checkpoint_dir"] == 1
    assert counted["config.json"] == 1 and counted["task.json"] == 1
    assert isinstance(loaded.model, FinetuneModel) and loaded.lm is loaded.model.gpt
    assert loaded.task is not None and loaded.task.labels == ["neg", "pos"]
    assert loaded.record == loaded.checkpoint.task and loaded.record["kind"] == "single"


def test_an_lstm_is_resolved_and_its_config_parsed_once(tmp_path, counted):
    folder = lstm_checkpoint(tmp_path / "lstm")
    counted.clear()
    loaded = load_for_inference(folder, "cpu", "fp32")
    assert counted["resolve_checkpoint_dir"] == 1 and counted["config.json"] == 1
    assert isinstance(loaded.model, LSTMLM) and loaded.tokenizer is not None
    assert loaded.window == 24  # no run.json: the model's own positions


def test_the_loaded_model_is_the_checkpoint_made_ready_for_inference(tmp_path):
    """What `load_for_inference` gives equals loading and `for_inference` done by hand."""
    folder = tiny_checkpoint(tmp_path / "ck")
    ids = torch.randint(0, 300, (2, 9))
    loaded = load_for_inference(folder, "cpu", "bf16")
    by_hand = for_inference(load_model(open_checkpoint(folder)), "cpu", "bf16")
    with torch.no_grad():
        assert torch.equal(loaded.lm(ids), by_hand(ids))


def test_an_open_folder_is_read_once_whatever_loads_it(tmp_path, counted):
    folder = lstm_checkpoint(tmp_path / "lstm")
    counted.clear()
    opened = open_checkpoint(folder)
    assert open_checkpoint(opened) is opened and isinstance(opened, CheckpointFolder)
    load_model(opened)
    load_for_inference(opened, "cpu", "fp32")
    assert counted["resolve_checkpoint_dir"] == 1 and counted["config.json"] == 1
    assert opened.arch == "lstm" and opened.tokenizer_dir == folder and opened.task is None


def test_a_folder_is_checked_when_opened(tmp_path):
    folder = lstm_checkpoint(tmp_path / "lstm")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "arch": "rnn"}))
    with pytest.raises(CheckpointError, match=r'lstm: unknown "arch" \'rnn\' in config.json'):
        open_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "task.json").write_text(json.dumps({"task": "sst2"}))
    opened = open_checkpoint(folder)  # the body alone loads without the task (convert)
    assert opened.finetuned and isinstance(load_model(opened), LSTMLM)
    with pytest.raises(CheckpointError, match="task.json: kind must be"):
        print(opened.task)
    with pytest.raises(CheckpointError, match="task.json: kind must be"):
        load_for_inference(folder, "cpu", "fp32")


def test_a_checkpoint_path_that_is_a_device_is_refused_naming_it(tmp_path, capsys):
    """A path that is neither a file nor a folder (here a link to /dev/full) is refused in one
    line; listing it as a run folder raised NotADirectoryError in info, evaluate, serve."""
    from gpt1.cli import main

    device = tmp_path / "full"
    device.symlink_to("/dev/full")
    with pytest.raises(CheckpointError, match="got neither a file nor a folder"):
        checkpoint_files.resolve_checkpoint_dir(device)
    assert main(["info", str(device)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpt1 info: error: {device}: expected a checkpoint folder") and (
        len(err.splitlines()) == 1
    )
