"""`gpt1 pretrain` end to end at tiny size: config resolution, exact resume after SIGKILL, SIGTERM,
plots, and user errors."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gpt1.cli import main
from gpt1.config import run_preset
from gpt1.errors import ConfigError, DataError
from gpt1.model.checkpoint import load_checkpoint
from gpt1.recipes.pretrain import finalize, resolve_config
from gpt1.text.windows import open_prepared
from gpt1.train.state import load_training_state, step_dirs
from helpers import fault_cases
from helpers.tiny import gpt1_process, make_corpus, subprocess_env, tiny_pretrain


def train_losses(run: Path) -> list[tuple[int, float]]:
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if "loss" in r]


def wait_for(path_glob, proc, run: Path, timeout: float = 120) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if list(run.glob(path_glob)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended before {path_glob} appeared: {proc.stderr.read()}")
        time.sleep(0.01)
    raise AssertionError(f"timeout waiting for {path_glob}")


# ------------------------------------------------------------------------------ config
def test_gpt1_preset_is_the_paper_recipe():
    cfg = run_preset("gpt1")
    assert (cfg.data.n_ctx, cfg.train.batch_size, cfg.train.lr) == (512, 64, 2.5e-4)
    assert (cfg.train.warmup, cfg.train.schedule, cfg.train.epochs) == (2000, "warmup_cosine", 100)
    assert cfg.model.embd_pdrop == cfg.model.attn_pdrop == cfg.model.resid_pdrop == 0.1
    assert (cfg.train.weight_decay, cfg.train.grad_clip, cfg.train.optimizer) == (0.01, 1.0, "oai")


def test_total_steps_and_vocab_from_data(tmp_path):
    data = open_prepared(make_corpus(tmp_path / "d", vocab=300))
    cfg = run_preset("gpt1")
    assert cfg.model.n_positions == 512
    cfg = finalize(cfg, data)
    assert cfg.model.vocab_size == 300
    assert cfg.train.max_steps == int(np.ceil(100 * 6000 / (64 * 512)))  # 100 epochs


def test_toml_then_flags_then_set(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('preset = "tiny"\n[train]\nlr = 0.5\nbatch_size = 8\n[model]\nn_layer = 3\n')
    cfg = resolve_config(None, toml, {"train": {"lr": 0.25, "seed": None}}, ["train.warmup=7"])
    assert (cfg.model.n_layer, cfg.train.batch_size, cfg.train.lr, cfg.train.warmup) == (
        3,
        8,
        0.25,
        7,
    )
    toml.write_text("[train]\nlearning_rate = 1\n")
    with pytest.raises(ConfigError, match="unknown key train.learning_rate"):
        resolve_config(None, toml)
    with pytest.raises(ConfigError, match="schedule"):
        resolve_config("tiny", None, None, ["train.schedule=cosine"])
    with pytest.raises(ConfigError, match="section.key=value"):
        resolve_config("tiny", None, None, ["lr=3"])


def test_bad_data_folder_errors(tmp_path, capsys):
    assert (
        main(
            ["pretrain", "--preset", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "r")]
        )
        == 2
    )
    assert "meta.json" in capsys.readouterr().err
    bad = make_corpus(tmp_path / "d")
    (bad / "meta.json").write_text(
        json.dumps({"format": "gpt1-tokens", "vocab_size": "x", "splits": {}})
    )
    with pytest.raises(DataError, match="vocab_size"):
        open_prepared(bad)


# ------------------------------------------------------------------------------ runs
@pytest.mark.slow
def test_exact_resume_after_sigkill(tmp_path):
    data = make_corpus(tmp_path / "data")
    every = ("--save-every", "3", "--eval-every", "10", "--log-every", "1")
    run_40 = lambda out, *extra: gpt1_process(*tiny_pretrain(data, out, 40, *every, *extra))
    full, cut = tmp_path / "full", tmp_path / "cut"
    subprocess.run(run_40(full), check=True, env=subprocess_env(), capture_output=True)

    proc = subprocess.Popen(
        run_40(cut),
        env=subprocess_env(),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    wait_for("step-6", proc, cut)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = max(int(p.name[5:]) for p in step_dirs(cut))
    assert killed_at < 40 and not (cut / "final").exists()
    subprocess.run(
        run_40(cut, "--resume", "auto"),
        check=True,
        env=subprocess_env(),
        capture_output=True,
    )

    assert train_losses(cut) == train_losses(full)  # bitwise, every step
    assert len(train_losses(full)) == 40
    a = load_file(str(full / "final" / "model.safetensors"))
    b = load_file(str(cut / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    vals = [json.loads(l) for l in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in vals if "val_loss" in r] == [0, 10, 20, 30, 40]
    assert (cut / "loss.png").is_file() and (cut / "run.json").is_file()
    assert load_checkpoint(cut).config.vocab_size == 300  # vocabulary from the data
    assert (cut / "final" / "vocab.json").is_file()


@pytest.mark.slow
def test_sigterm_writes_checkpoint_then_exits(tmp_path):
    data = make_corpus(tmp_path / "data")
    run = tmp_path / "run"
    proc = subprocess.Popen(
        gpt1_process(*tiny_pretrain(data, run, 100_000, "--save-every", "0")),
        env=subprocess_env(),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    wait_for("metrics.jsonl", proc, run)
    end = time.time() + 60
    while not train_losses(run) and time.time() < end:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    steps = step_dirs(run)
    assert len(steps) == 1 and not (run / "final").exists()
    _, meta = load_training_state(steps[0])
    assert meta["step"] == int(steps[0].name[5:]) >= 1
    # refusing to start over silently in a folder with checkpoints
    again = subprocess.run(
        gpt1_process(*tiny_pretrain(data, run, 3)),
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "--resume auto" in again.stderr


def test_plot_command_writes_pngs(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 0, "val_loss": 5.0, "val_ppl": 148.4}]
    lines += [{"step": s, "loss": 6.0 - 0.1 * s, "lr": 1e-3 * s} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    assert main(["plot", str(run)]) == 0
    for name in ("loss.png", "lr.png"):
        assert (run / name).read_bytes()[:4] == b"\x89PNG"
    (run / "metrics.jsonl").write_text("{not json\n")
    assert main(["plot", str(run)]) == 2
    assert "metrics.jsonl:1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "line, field",
    [
        ('{"loss": 3.0, "lr": 0.001}', "step"),
        ('{"step": 1e308, "loss": 3.0}', "step"),
        ('{"step": 1' + "0" * 400 + ', "loss": 3.0}', "step"),
        ('{"step": -1, "loss": 3.0}', "step"),
        ('{"step": 7, "loss": "low"}', "loss"),
        ('{"step": 7, "loss": 1' + "0" * 400 + "}", "loss"),
        ('{"step": 7, "val_loss": -1e308}', "val_loss"),
        ('{"step": 1' + "0" * 5000 + "}", None),
        ("[7, 3.0]", None),
        (
            '{"step": 7, "loss": "\xff"}'.encode("latin-1").decode("utf-8", "surrogateescape"),
            "loss",
        ),
    ],
)
def test_plot_refuses_a_damaged_metrics_line_naming_line_and_field(tmp_path, line, field):
    from helpers.tiny import run_cli

    run = tmp_path / "run"
    run.mkdir()
    good = [{"step": 1, "loss": 6.0, "lr": 1e-3}, {"step": 1, "val_loss": 5.0, "val_ppl": 148.4}]
    text = "".join(json.dumps(l) + "\n" for l in good) + line + "\n"
    (run / "metrics.jsonl").write_bytes(text.encode("utf-8", "surrogateescape"))
    for argv in (["plot", str(run)], ["plot", str(run), "--metric", "loss"]):
        code, err = run_cli(argv)
        assert code == 2 and "\n" not in err, err
        assert f"metrics.jsonl:3{f', field {field!r}' if field else ''}: " in err
    assert not list(run.glob("*.png"))


def test_a_plot_that_cannot_be_drawn_leaves_the_older_pair(tmp_path, monkeypatch):
    """A run's plots are drawn in full before either is written: a failure drawing lr.png
    leaves loss.png and lr.png as they were, never a new loss.png beside an old lr.png."""
    from gpt1.train import telemetry

    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": s, "loss": 6.0 - 0.1 * s, "lr": 1e-3 * s} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
    for name in ("loss.png", "lr.png"):
        (run / name).write_bytes(b"older " + name.encode())
    from matplotlib.figure import Figure

    real_savefig, drawn = Figure.savefig, []

    def second_fails(fig, *args, **kwargs):
        drawn.append(fig)
        if len(drawn) == 2:
            raise RuntimeError("cannot draw")
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", second_fails)
    with pytest.raises(RuntimeError, match="cannot draw"):
        telemetry.plot_run(run)
    assert len(drawn) == 2
    assert [(run / n).read_bytes() for n in ("loss.png", "lr.png")] == [
        b"older loss.png",
        b"older lr.png",
    ]


def test_loss_plot_names_each_curve_by_what_the_log_records(tmp_path, monkeypatch):
    """Pretraining's curves are LM cross-entropy; fine-tuning's `loss` is task + lm_coef x LM
    (the coefficient read back from the logged terms), drawn beside each term, the task's loss
    named as the run's run.json records its task (cross-entropy, or squared error)."""
    from gpt1.train import telemetry

    def drawn(lines: list[dict], task: dict | None = None) -> tuple[dict[str, list], str]:
        run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
        if task is not None:
            (run / "run.json").write_text(json.dumps({"task": task}))
        seen = {}

        def keep(fig):
            if "axis" not in seen:  # loss.png is drawn first, then lr.png
                ax = fig.axes[0]
                seen["axis"] = ax.get_ylabel()
                seen["curves"] = {l.get_label(): list(l.get_ydata()) for l in ax.lines}
            return real_png(fig)

        real_png = telemetry.png
        monkeypatch.setattr(telemetry, "png", keep)
        telemetry.plot_run(run)
        return seen["curves"], seen["axis"]

    pretrain = [{"step": 1, "loss": 6.0, "lr": 1e-3}, {"step": 2, "val_loss": 5.0}]
    assert drawn(pretrain) == (
        {"train LM cross-entropy": [6.0], "validation LM cross-entropy": [5.0]},
        "LM cross-entropy (nats/token)",
    )
    finetune = [
        {"step": s, "loss": 0.7 + 0.5 * lm, "task_loss": 0.7, "lm_loss": lm, "lr": 1e-4}
        for s, lm in ((1, 4.0), (2, 3.2))
    ]
    classes = {"kind": "single", "labels": ["0", "1"]}
    assert drawn(finetune, classes) == (
        {
            "fine-tuning loss: task + 0.5 x LM": [2.7, 2.3],
            "task loss: cross-entropy (nats/example)": [0.7, 0.7],
            "auxiliary LM cross-entropy (nats/token)": [4.0, 3.2],
        },
        "loss (nats)",
    )
    assert drawn(finetune)[0]["task loss"] == [0.7, 0.7]  # no run.json: no claim of a unit
    no_lm = [{"step": 1, "loss": 0.3, "task_loss": 0.3, "lr": 1e-4}]
    regression = {"kind": "similarity", "labels": None}
    assert drawn(no_lm, regression) == (
        {"fine-tuning loss = task loss (no auxiliary LM)": [0.3]},
        "squared error",
    )


def test_plot_compares_several_runs_on_one_figure(tmp_path, monkeypatch, capsys):
    from gpt1.train import telemetry

    runs = []
    for name, offset in (("a", 0.0), ("b", 0.5)):
        run = tmp_path / name
        run.mkdir()
        lines = [{"step": s, "loss": 6.0 - 0.1 * s, "lr": 1e-3} for s in range(1, 7)]
        lines += [{"step": s, "val_loss": 5.0 + offset - 0.2 * s} for s in (0, 3, 6)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
        runs.append(run)
    drawn = {}
    real_save = telemetry.save_figure

    def keep(fig, path):
        drawn["lines"] = [
            (l.get_label(), list(l.get_xdata()), list(l.get_ydata())) for l in fig.axes[0].lines
        ]
        return real_save(fig, path)

    monkeypatch.setattr(telemetry, "save_figure", keep)
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(runs[0]), str(runs[1]), "--metric", "val_loss"]) == 0
    out = tmp_path / "compare-val_loss.png"
    assert out.read_bytes()[:4] == b"\x89PNG" and str(out.name) in capsys.readouterr().out
    assert drawn["lines"] == [
        (str(runs[0]), [0, 3, 6], pytest.approx([5.0, 4.4, 3.8])),
        (str(runs[1]), [0, 3, 6], pytest.approx([5.5, 4.9, 4.3])),
    ]
    # An existing figure is replaced only with --overwrite; a missing metric names the run.
    assert main(["plot", str(runs[0]), str(runs[1]), "--metric", "val_loss"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["plot", *map(str, runs), "--metric", "val_loss", "--overwrite"]) == 0
    assert main(["plot", *map(str, runs), "--metric", "dev_accuracy"]) == 2
    err = capsys.readouterr().err
    assert str(runs[0]) in err and "no 'dev_accuracy'" in err and "val_loss" in err
    # A run's metrics.jsonl and its folder are the command's inputs: never replaced, even with
    # --overwrite, and refused before anything is drawn.
    for target in (runs[1] / "metrics.jsonl", runs[0], runs[0] / "metrics.jsonl"):
        before = [(r / "metrics.jsonl").read_bytes() for r in runs]
        argv = ["plot", *map(str, runs), "--metric", "loss", "--out", str(target), "--overwrite"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "an input of this command" in err and len(err.strip().splitlines()) == 1, err
        assert [(r / "metrics.jsonl").read_bytes() for r in runs] == before
        assert runs[0].is_dir() and not (runs[0] / "loss.png").exists()
    # A figure inside a run folder is not an input.
    assert main(["plot", str(runs[0]), "--metric", "loss", "--out", str(runs[0] / "cmp.png")]) == 0
    # One run keeps today's two plots.
    assert main(["plot", str(runs[0])]) == 0
    assert (runs[0] / "loss.png").is_file() and (runs[0] / "lr.png").is_file()


def test_set_overrides_are_checked_together_in_any_order():
    from gpt1.errors import ConfigError
    from gpt1.recipes.pretrain import resolve_config

    cfg = resolve_config("tiny", sets=["model.n_embd=96", "model.n_head=3"])
    assert (cfg.model.n_embd, cfg.model.n_head) == (96, 3)
    with pytest.raises(ConfigError, match="divisible"):
        resolve_config("tiny", sets=["model.n_embd=96", "model.n_head=5"])


# ------------------------------------------------------------------------------- resumes
# The cases live in helpers.fault_cases (the fault report runs them too); one finished tiny
# run per module (conftest's `resume_work`), copied for each case.
@pytest.mark.parametrize("name", fault_cases.refused_resumes("pretrain"))
def test_resume_refuses_a_setting_that_changes_the_run(resume_work, name):
    """Model, data, lr, batch and seed cannot change on --resume: one line naming the setting
    and both values, and run.json and every checkpoint stay as they were."""
    assert fault_cases.resume_refused(resume_work, name) == []


def test_resume_on_re_prepared_data_names_its_meta_json(tmp_path):
    assert fault_cases.resume_on_another_vocabulary(tmp_path) == []


def test_resume_on_other_tokens_of_the_same_sizes_is_refused(tmp_path):
    assert fault_cases.resume_on_other_tokens(tmp_path) == []


def test_resume_on_its_data_moved_elsewhere_trains_the_same_weights(resume_work):
    assert fault_cases.resume_on_moved_data(resume_work) == []


def test_resume_past_its_length_is_refused_and_a_finished_run_stays_as_it_is(resume_work):
    assert fault_cases.resume_past_its_length(resume_work) == []


def test_resume_accepts_more_steps_and_records_them(resume_work):
    assert fault_cases.resume_accepts(resume_work, "pretrain") == []
    run = json.loads((resume_work / "accepted-pretrain" / "run.json").read_text())
    assert run["train"]["max_steps"] == 4 and run["resumes"][0]["from"].endswith("step-2")


def test_resume_compares_only_settings_both_sides_record():
    from gpt1.train import resume

    source = Path("RUN/step-2/trainer_state.json")
    recorded = {"train": {"lr": 1e-3, "max_steps": 2, "resume": ""}, "data": {"path": "d"}}
    # A setting the checkpoint does not record (added to gpt1 since) is not refused.
    requested = {"train": {"lr": 1e-3, "max_steps": 5, "resume": "auto", "new": 1}}
    assert resume.changes(recorded, requested, source) == {"train.max_steps": [2, 5]}
    with pytest.raises(ConfigError, match=r"train.lr: .* has 0.001 \(RUN.*asks for 0.5"):
        resume.changes(recorded, {"train": {"lr": 0.5}}, source)
    with pytest.raises(ConfigError, match="train.micro_batch_size"):
        resume.changes(
            {"train": {"micro_batch_size": 2}},
            {"train": {"micro_batch_size": 4}},
            source,
            fixed=frozenset({"train.micro_batch_size"}),
        )


NO_DROPOUT = ("--set", "model.embd_pdrop=0", "--set", "model.attn_pdrop=0")
NO_DROPOUT += ("--set", "model.resid_pdrop=0")


def test_resume_with_another_micro_batch_is_the_same_run_only_without_dropout(tmp_path):
    """What docs/commands/pretrain.md says of `--micro-batch` on a resume: the same windows and
    global batch always; without dropout the same gradients up to float rounding (another
    summation order); with dropout each micro-batch draws its own masks, so the losses and
    weights from the resumed step on differ as much as another seed's masks would (only the
    run's own micro-batch resumes bit for bit)."""
    data = make_corpus(tmp_path / "data")
    for label, extra in (("dropout 0.1", ()), ("dropout 0", NO_DROPOUT)):
        ref = tmp_path / f"ref-{len(extra)}"
        assert main(["--quiet", *tiny_pretrain(data, ref, 4, *extra)]) == 0
        for micro in ("2", "4"):  # the run's own (the tiny preset's) and another
            run = tmp_path / f"{len(extra)}-{micro}"
            assert main(["--quiet", *tiny_pretrain(data, run, 2, *extra)]) == 0
            again = tiny_pretrain(data, run, 4, "--resume", "auto", "--micro-batch", micro)
            assert main(["--quiet", *again, *extra]) == 0
            a, b = (load_file(r / "final" / "model.safetensors") for r in (ref, run))
            weights = max(float((a[k] - b[k]).abs().max()) for k in a)
            losses = [(x, y) for (_, x), (_, y) in zip(train_losses(ref), train_losses(run))]
            loss = max(abs(x - y) for x, y in losses)
            print(f"{label}, --micro-batch {micro}: step-3/4 losses {losses[2:]}, ", end="")
            print(f"largest loss difference {loss:.2g}, weight difference {weights:.2g}")
            if micro == "2":
                assert loss == 0 and weights == 0  # bit for bit
            elif extra:
                assert loss < 1e-5 and weights < 1e-6  # float rounding
            else:
                assert loss > 1e-4 and weights > 1e-4  # other dropout masks
