"""Analyses: position-embedding summary and plots, sweep bookkeeping and resumption, the CLI."""

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINIER_MODEL, tiny_model_config

from gpt1 import GPT, ModelConfig, save_model
from gpt1.analysis.positions import analyse_positions, cosine_matrix, project_2d, summarise
from gpt1.analysis.sweep import Sweep
from gpt1.cli import main
from gpt1.errors import CheckpointError, ConfigError, DataError
from gpt1.model.lstm import LSTMLM, LSTMConfig
from gpt1.model.registry import save_lstm


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


def smooth_positions_checkpoint(tmp_path):
    """The tinier GPT whose position embeddings vary smoothly (what `analysis positions` draws)."""
    model = GPT(ModelConfig(**TINIER_MODEL))
    with torch.no_grad():
        model.wpe.weight.copy_(torch.tensor(smooth_table(24, 16), dtype=torch.float32))
    return save_model(model, tmp_path / "ck")


def test_positions_command_writes_pngs_summary_and_command(tmp_path, capsys):
    ck = smooth_positions_checkpoint(tmp_path)
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
    save_lstm(
        LSTMLM(LSTMConfig(vocab_size=20, n_embd=8, hidden_size=8, n_positions=8)), tmp_path / "l"
    )
    with pytest.raises(CheckpointError, match="no position embeddings"):
        analyse_positions(tmp_path / "l", tmp_path / "o")
    assert main(["analysis", "positions", str(tmp_path / "l"), "--out", str(tmp_path / "o")]) == 2


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--max-positions", "1"], "--max-positions must be at least 2"),
        (["--max-positions", "-1"], "--max-positions must be at least 2"),
        (["--max-positions", "0"], "--max-positions must be at least 2"),
        (["--max-positions", "25"], "more than the 24 positions"),
        (["--seed", "-1"], "--seed must be in 0..2**32-1"),
    ],
)
def test_positions_refuses_bad_values_in_one_line_before_making_out(tmp_path, capsys, flags, says):
    ck = smooth_positions_checkpoint(tmp_path)
    out = tmp_path / "new" / "pos"
    assert main(["analysis", "positions", str(ck), "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "table,why",
    [
        (np.ones((10, 4)), "all rows point the same way"),
        (np.outer(np.arange(1.0, 11.0), np.ones(4)), "all rows point the same way"),
        (np.zeros((10, 4)), "a row of zeros"),
        (np.ones((10, 4)) + 1e-200 * np.arange(40.0).reshape(10, 4), "all rows point the same"),
    ],
)
def test_tsne_on_rows_all_one_way_falls_back_to_pca_with_one_note(table, why, caplog):
    # sklearn's t-SNE segfaulted on these rows; the check happens before its native code runs.
    coords, used = project_2d(table)
    assert used == "pca" and coords.shape == (10, 2)
    notes = [r.getMessage() for r in caplog.records if r.name == "gpt1.analysis.positions"]
    assert len(notes) == 1 and why in notes[0] and "PCA" in notes[0]


def test_tsne_runs_on_tables_of_any_scale():
    for scale in (1e-300, 1e300):  # lengths under- and overflowed (a segfault before)
        assert project_2d(scale * smooth_table(10, 4))[1] == "tsne"


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


def test_growable_settings_may_gain_tasks_and_a_row_but_not_change(tmp_path):
    first = {"init": "a", "lstm_init": None, "plan": {"sst2": {"data": "d1"}}}
    Sweep(tmp_path, "ablations", first, growable=("plan", "lstm_init")).run(
        "sst2/full/seed=0", ["x"], lambda: {"v": 1}
    )
    grown = {"init": "a", "lstm_init": "L", "plan": {"cola": {"data": "d2"}}}
    sweep = Sweep(tmp_path, "ablations", grown, growable=("plan", "lstm_init"))
    assert sweep.done("sst2/full/seed=0") and sweep.done_with_prefix("sst2/full/seed=") == [
        "sst2/full/seed=0"
    ]
    record = json.loads((tmp_path / "sweep.json").read_text())["settings"]
    assert record["plan"] == {"sst2": {"data": "d1"}, "cola": {"data": "d2"}}
    assert record["lstm_init"] == "L"
    # Once set, a growable value must match; a shared task must keep its data; init never grows.
    for bad, field in (
        ({**grown, "lstm_init": "M"}, "lstm_init"),
        ({**grown, "plan": {"sst2": {"data": "other"}}}, "plan"),
        ({**grown, "init": "b"}, "init"),
    ):
        with pytest.raises(ConfigError, match=field):
            Sweep(tmp_path, "ablations", bad, growable=("plan", "lstm_init"))
    # A later invocation without the LSTM keeps the recorded one.
    Sweep(tmp_path, "ablations", {**grown, "lstm_init": None}, growable=("plan", "lstm_init"))
    assert json.loads((tmp_path / "sweep.json").read_text())["settings"]["lstm_init"] == "L"


# ------------------------------------------------------------------ sweeps over gpt1 finetune
FT = ["--max-steps", "2", "--batch-size", "4", "--micro-batch", "2"]


@pytest.fixture
def sst2_setup(tmp_path, shared_data, gpt1_vocab):
    """A tiny pretrained GPT and LSTM (with the GPT-1 vocabulary) and 40/24 SST-2 rows."""
    glue = shared_data / "glue" / "SST-2"
    data = tmp_path / "sst2"
    data.mkdir()
    for name, n in (("train.tsv", 41), ("dev.tsv", 25)):
        lines = (glue / name).open(encoding="utf-8").readlines()[:n]
        (data / name).write_text("".join(lines), encoding="utf-8")
    torch.manual_seed(0)
    gpt = GPT(tiny_model_config(vocab_size=40478, n_positions=64, n_head=2))
    lstm = LSTMLM(LSTMConfig(vocab_size=40478, n_embd=32, hidden_size=32, n_positions=64))
    return {
        "data": data,
        "gpt": save_model(gpt, tmp_path / "gpt", tokenizer_dir=gpt1_vocab),
        "lstm": save_lstm(lstm, tmp_path / "lstm", tokenizer_dir=gpt1_vocab),
    }


def sst2_sweep(sweep: str, sst2_setup, out: Path, *options: str) -> list[str]:
    """The command line of `gpt1 analysis <sweep>` fine-tuning the SST-2 setup's GPT into `out`."""
    run = ["--init", str(sst2_setup["gpt"]), "--task", "sst2", "--data", str(sst2_setup["data"])]
    return ["analysis", sweep, *run, "--out", str(out), *options, *FT]


def finetune_lines(out):
    return [
        shlex.split(l)
        for l in (out / "commands.txt").read_text().splitlines()
        if l.startswith("gpt1 finetune")
    ]


@pytest.mark.slow
@pytest.mark.data
def test_layers_sweep_plots_resumes_and_records_reproducible_commands(tmp_path, sst2_setup, capsys):
    out = tmp_path / "layers"
    argv = sst2_sweep(
        "layers", sst2_setup, out, "--train-examples", "20", "--train-eval-examples", "12"
    )
    assert main(argv) == 0
    table = json.loads((out / "layers.json").read_text())
    assert [r["k"] for r in table["rows"]] == [0, 1, 2] and table["metric"] == "accuracy"
    assert all(
        0 <= r["dev"] <= 1 and 0 <= r["train"] <= 1 and r["seeds"] == 1 for r in table["rows"]
    )
    assert (out / "layers.png").read_bytes()[:4] == b"\x89PNG"
    record = json.loads((out / "sweep.json").read_text())
    assert record["runs"]["k=0/seed=0"]["result"]["train_results"]["n"] == 12
    assert record["runs"]["k=1/seed=0"]["result"]["dev_results"]["train_n"] == 20
    lines = finetune_lines(out)
    assert [l[l.index("--transfer-layers") + 1] for l in lines] == ["0", "1", "2"]

    # Re-running continues: nothing is fine-tuned again, the table is the same.
    assert main(argv) == 0
    assert len(finetune_lines(out)) == 3
    assert json.loads((out / "layers.json").read_text()) == table

    # A recorded command reproduces its sub-run's dev number exactly.
    line = lines[1]
    line[line.index("--out") + 1] = str(tmp_path / "again")
    assert main(line[1:]) == 0
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["accuracy"] == table["rows"][1]["dev"]


def run_ablations(sst2_setup, out, *options: str) -> int:
    """`gpt1 analysis ablations` on the SST-2 setup (GPT and LSTM inits) into `out`."""
    inits = ["--init", str(sst2_setup["gpt"]), "--lstm-init", str(sst2_setup["lstm"])]
    root = str(sst2_setup["data"].parent)
    tasks = ["--tasks", "sst2", "--data-root", root, "--task-data", "sst2=sst2"]
    return main(["analysis", "ablations", *inits, *tasks, "--out", str(out), *options, *FT])


@pytest.mark.slow
@pytest.mark.data
def test_ablations_table_with_lstm_row(tmp_path, sst2_setup):
    out = tmp_path / "abl"
    assert run_ablations(sst2_setup, out) == 0
    table = json.loads((out / "ablations.json").read_text())
    assert list(table["rows"]) == ["full", "scratch", "no_aux", "lstm"]
    for row in table["rows"].values():
        assert row["avg"] == row["cells"]["sst2"]["mean"] and 0 <= row["avg"] <= 1
    md = (out / "ablations.md").read_text()
    assert "| method | Avg | sst2 (acc) |" in md and "LSTM w/ aux LM" in md
    lines = finetune_lines(out)
    assert len(lines) == 4
    assert (
        "--transfer-layers" in lines[1]
        and lines[1][lines[1].index("--transfer-layers") + 1] == "-1"
    )
    assert lines[2][lines[2].index("--lm-coef") + 1] == "0.0"
    assert lines[3][lines[3].index("--init") + 1] == str(sst2_setup["lstm"])
    # --rows runs only the rows asked for; the table keeps every row with results.
    only = tmp_path / "abl-lstm"
    assert run_ablations(sst2_setup, only, "--rows", "lstm") == 0
    assert len(finetune_lines(only)) == 1
    rows = json.loads((only / "ablations.json").read_text())["rows"]
    assert (
        rows["lstm"]["cells"]["sst2"]["seeds"] == 1 and rows["full"]["cells"]["sst2"]["seeds"] == 0
    )
    # The fine-tuned LSTM run reloads as an LSTM.
    from gpt1.recipes.evaluate import load_finetuned

    model, _, _ = load_finetuned(out / "runs" / "sst2-lstm-seed0")
    assert isinstance(model.gpt, LSTMLM)


@pytest.mark.slow
@pytest.mark.data
def test_data_size_curve_uses_subsets_and_both_arms(tmp_path, sst2_setup):
    out = tmp_path / "ds"
    assert main(sst2_sweep("data-size", sst2_setup, out, "--sizes", "10,all", "--seeds", "0")) == 0
    table = json.loads((out / "data_size.json").read_text())
    assert [r["size"] for r in table["rows"]] == ["10", "all"]
    assert [r["pretrained"]["train_n"] for r in table["rows"]] == [10, 40]
    assert all(r["scratch"]["seeds"] == 1 for r in table["rows"])
    assert (out / "data_size.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        "| size | examples | pretrained | no pretraining | seeds |"
        in (out / "data_size.md").read_text()
    )


@pytest.mark.parametrize(
    "command,message",
    [
        ("data-size --init x --task sst2 --data d --sizes 10,lots", "--sizes"),
        ("ablations --init x --tasks nope --data-root d", "--task-data nope=DIR"),
        ("ablations --init x --tasks sst2 --data-root root --rows lstm", "needs --lstm-init"),
        ("layers --init x --task sst2 --data d --seeds 0,-1", "--seeds must be in 0..2**32-1"),
        ("data-size --init x --task sst2 --data d --seeds " + "9" * 30, "--seeds must be in 0.."),
    ],
)
def test_bad_sweep_options_are_one_line_errors(tmp_path, monkeypatch, capsys, command, message):
    monkeypatch.chdir(tmp_path)
    Path("root/glue/SST-2").mkdir(parents=True)  # SST-2's data is found: only the option is wrong
    assert main(["analysis", *command.split(), "--out", "out"]) == 2
    assert message in capsys.readouterr().err


def test_data_size_and_layers_tables_cover_every_recorded_run(tmp_path):
    """A sweep grown over several invocations (other sizes, K values or seeds) is tabulated
    whole, not just the part the latest command line asked for."""
    from gpt1.analysis import data_size, layers

    sweep = Sweep(tmp_path / "ds", "data-size", {"task": "sst2"})
    for key, value in (
        ("pretrained/n=100/seed=0", 0.6),
        ("pretrained/n=100/seed=1", 0.7),
        ("scratch/n=100/seed=0", 0.5),
        ("pretrained/n=3000/seed=0", 0.8),
        ("pretrained/n=all/seed=0", 0.9),
    ):
        sweep.run(key, ["x"], lambda v=value: {"metric": "accuracy", "value": v, "train_n": 1})
    sizes = data_size.recorded_sizes(sweep, [300])
    assert sizes == [100, 300, 3000, None]
    table = data_size.summarise(sweep, sizes, "sst2")
    first = table["rows"][0]
    assert first["pretrained"]["seeds"] == 2 and abs(first["pretrained"]["mean"] - 0.65) < 1e-9
    assert first["scratch"]["seeds"] == 1 and table["rows"][1]["pretrained"]["seeds"] == 0
    assert table["rows"][-1]["size"] == "all"

    sweep = Sweep(tmp_path / "layers", "layers", {"task": "sst2"})
    for key in ("k=0/seed=0", "k=2/seed=0", "k=2/seed=1"):
        sweep.run(key, ["x"], lambda: {"metric": "accuracy", "dev": 0.6, "train": 0.7})
    table = layers.summarise(sweep, [0, 1, 2], "sst2", 2)
    assert [r["seeds"] for r in table["rows"]] == [1, 0, 2]


def test_a_refused_analysis_leaves_its_out_as_it_found_it(tmp_path, capsys):
    """Refused before anything ran (a file where a checkpoint goes, an unknown task, missing
    data): no folder made, nested or not, and a commands.txt already there not appended to."""
    from helpers.fault_cases import tree
    from helpers.tiny import make_task, tiny_checkpoint

    ckpt, task = tiny_checkpoint(tmp_path / "ckpt"), make_task(tmp_path / "task")
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "commands.txt").write_text("my notes\n")
    before = tree(kept)
    for argv, out, said in (
        (["positions", str(tmp_path / "notes.txt")], tmp_path / "p" / "q", "got a file"),
        (["positions", str(tmp_path / "missing")], kept, "no such checkpoint"),
        (
            ["layers", "--init", str(ckpt), "--task", "bogus", "--data", str(task)],
            tmp_path / "s",
            "unknown task",
        ),
        (
            ["layers", "--init", str(ckpt), "--task", "rte", "--data", str(tmp_path / "nope")],
            tmp_path / "a" / "b" / "c",
            "gpt1 analysis: error:",  # refused in its first sub-run, after the folders were made
        ),
    ):
        assert main(["analysis", *argv, "--out", str(out), "--threads", "1"]) == 2, argv
        assert said in capsys.readouterr().err
    assert not any((tmp_path / n).exists() for n in ("p", "s", "a"))
    assert tree(kept) == before
