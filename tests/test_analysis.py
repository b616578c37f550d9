"""Analyses: position-embedding summary and plots, sweep bookkeeping and resumption, the CLI."""
import json
import shlex

import numpy as np
import pytest
import torch

from gpt1 import GPT, ModelConfig, save_model
from gpt1.analysis.positions import analyse_positions, cosine_matrix, project_2d, summarise
from gpt1.analysis.sweep import Sweep
from gpt1.cli import main
from gpt1.errors import CheckpointError, ConfigError, DataError
from gpt1.lstm import LSTMLM, LSTMConfig, save_lstm


def smooth_table(n: int = 40, c: int = 16) -> np.ndarray:
    # Sinusoids of low frequency: each row is close to its neighbours and far from distant rows.
    pos = np.arange(n)[:, None]
    freqs = np.linspace(0.5, 2.0, c // 2)[None, :] * np.pi / n
    return np.concatenate([np.sin(pos * freqs), np.cos(pos * freqs)], axis=1)


# ------------------------------------------------------------------------------ positions
def test_summary_separates_smooth_from_random_tables():
    smooth = summarise(cosine_matrix(smooth_table()))
    rand = summarise(cosine_matrix(np.random.default_rng(0).normal(size=(40, 16))))
    assert smooth["nearest_within_2"] == 1.0
    assert smooth["mean_cos_neighbours"] > 0.95 > smooth["mean_cos_distant"] + 0.3
    assert abs(rand["mean_cos_neighbours"]) < 0.3 and rand["nearest_within_2"] < 0.5
    assert set(smooth["mean_cos_by_offset"]) == {"1", "2", "4", "8", "16", "32"}


def test_cosine_matrix_is_symmetric_with_unit_diagonal():
    cos = cosine_matrix(np.random.default_rng(1).normal(size=(7, 5)))
    np.testing.assert_allclose(np.diag(cos), 1.0)
    np.testing.assert_allclose(cos, cos.T)


def test_pca_projection_and_bad_method():
    coords, used = project_2d(smooth_table(), method="pca")
    assert used == "pca" and coords.shape == (40, 2)
    with pytest.raises(ConfigError):
        project_2d(smooth_table(), method="umap")


def tiny_checkpoint(tmp_path, smooth: bool = True):
    model = GPT(ModelConfig(vocab_size=50, n_positions=24, n_embd=16, n_layer=1, n_head=2))
    if smooth:
        with torch.no_grad():
            model.wpe.weight.copy_(torch.tensor(smooth_table(24, 16), dtype=torch.float32))
    return save_model(model, tmp_path / "ck")


def test_positions_command_writes_pngs_summary_and_command(tmp_path, capsys):
    ck = tiny_checkpoint(tmp_path)
    out = tmp_path / "pos"
    assert main(["analysis", "positions", str(ck), "--out", str(out)]) == 0
    for name in ("positions_2d.png", "positions_cosine.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "positions.json").read_text())
    assert summary["method"] == "tsne" and summary["n_positions"] == 24
    assert summary["nearest_within_2"] == 1.0
    lines = (out / "commands.txt").read_text().splitlines()
    argv = shlex.split(lines[-1])
    assert argv[:4] == ["gpt1", "analysis", "positions", str(ck)]
    assert "--method" in argv and "tsne" in argv
    assert '"mean_cos_neighbours"' in capsys.readouterr().out


def test_positions_of_an_lstm_is_a_clear_error(tmp_path, capsys):
    save_lstm(LSTMLM(LSTMConfig(vocab_size=20, n_embd=8, hidden_size=8, n_positions=8)),
              tmp_path / "l")
    with pytest.raises(CheckpointError, match="no position embeddings"):
        analyse_positions(tmp_path / "l", tmp_path / "o")
    assert main(["analysis", "positions", str(tmp_path / "l"), "--out", str(tmp_path / "o")]) == 2


# ---------------------------------------------------------------------------------- sweep
def test_sweep_skips_finished_runs_and_resumes_after_a_crash(tmp_path):
    calls = []

    def job(key, fail=False):
        def fn():
            calls.append(key)
            if fail:
                raise KeyboardInterrupt  # a sweep killed during sub-run `key`
            return {"acc": len(key)}
        return fn

    sweep = Sweep(tmp_path, "layers", {"task": "sst2"}, ["gpt1", "analysis", "layers"])
    assert sweep.run("k0", ["gpt1", "finetune", "a b"], job("k0")) == {"acc": 2}
    partial = tmp_path / "runs" / "k1"
    partial.mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt):
        sweep.run("k1", ["gpt1", "finetune", "x"], job("k1", fail=True), run_dir=partial)

    again = Sweep(tmp_path, "layers", {"task": "sst2"}, ["gpt1", "analysis", "layers"])
    assert again.done("k0") and not again.done("k1")
    assert again.run("k0", ["ignored"], job("k0")) == {"acc": 2}
    partial.mkdir(parents=True)  # what the killed attempt left behind
    (partial / "junk").write_text("half-written")
    assert again.run("k1", ["gpt1", "finetune", "x"], job("k1"), run_dir=partial) == {"acc": 2}
    assert not (partial / "junk").exists()
    assert calls == ["k0", "k1", "k1"]
    record = json.loads((tmp_path / "sweep.json").read_text())
    assert sorted(record["runs"]) == ["k0", "k1"]
    assert record["runs"]["k0"]["command"] == "gpt1 finetune 'a b'"
    commands = (tmp_path / "commands.txt").read_text()
    assert commands.count("gpt1 analysis layers") == 2 and "gpt1 finetune 'a b'" in commands


def test_sweep_refuses_other_settings_and_unreadable_records(tmp_path):
    Sweep(tmp_path, "layers", {"task": "sst2", "init": "a"})
    with pytest.raises(ConfigError, match="init: recorded 'a', now 'b'"):
        Sweep(tmp_path, "layers", {"task": "sst2", "init": "b"})
    with pytest.raises(ConfigError, match="holds a 'layers' analysis"):
        Sweep(tmp_path, "ablations", {"task": "sst2", "init": "a"})
    (tmp_path / "sweep.json").write_text("{not json")
    with pytest.raises(DataError, match="sweep.json"):
        Sweep(tmp_path, "layers", {"task": "sst2", "init": "a"})
