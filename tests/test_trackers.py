"""`--logger tensorboard|wandb|mlflow`: each tracker holds what metrics.jsonl holds, read back
with the tracker's own reader (TensorBoard's EventAccumulator, W&B's offline run files through
its datastore reader, MLflow's client on the run's store); a resumed run continues the same
tracker run with no step twice; a tracker whose package is missing is refused before anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpt1.cli import main
from gpt1.train import trackers
from helpers.tiny import gpt1_process, make_task, subprocess_env, tiny_finetune, tiny_pretrain

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")

LOGGERS = ["--logger", "tensorboard", "--logger", "wandb", "--logger", "mlflow"]
COMPARED = ("loss", "lr", "grad_norm", "val_loss", "val_ppl")  # identical on replay
ALL = (*COMPARED, "tokens_per_s", "mfu", "mem_gb")


@pytest.fixture(scope="module")
def offline_wandb(tmp_path_factory):
    """W&B offline, its caches and settings inside the test's folder."""
    home = tmp_path_factory.mktemp("wandb_home")
    saved = dict(os.environ)
    os.environ.update(
        WANDB_MODE="offline",
        WANDB_CONFIG_DIR=str(home / "config"),
        WANDB_CACHE_DIR=str(home / "cache"),
        WANDB_DATA_DIR=str(home / "data"),
        WANDB_SILENT="true",
    )
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    import wandb

    wandb.teardown()
    os.environ.clear()
    os.environ.update(saved)


def pretrain_args(
    data: Path, out: Path, steps: int, *extra: str, loggers: list[str] = LOGGERS
) -> list[str]:
    """The tracked tiny run: a checkpoint and a validation every 3 steps, an 8-step schedule
    however many steps this segment runs, metrics sent to `loggers`."""
    flags = ("--save-every", "3", "--eval-every", "3", "--set", "train.total_steps=8")
    return ["--quiet", *tiny_pretrain(data, out, steps, *flags, *loggers, *extra)]


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, tiny_corpus, offline_wandb) -> Path:
    """Eight steps in two segments: the first stops at step 6 (as a run killed after logging
    step 6 whose last checkpoint is step 3), the second resumes from step-3 and replays 4..6."""
    run = tmp_path_factory.mktemp("tracked") / "run"
    assert main(pretrain_args(tiny_corpus, run, 6)) == 0
    first = json.loads((run / trackers.RECORD_FILE).read_text())
    resume = ["--resume", str(run / "step-3")]
    assert main(pretrain_args(tiny_corpus, run, 8, *resume)) == 0
    assert json.loads((run / trackers.RECORD_FILE).read_text()) == first  # the same runs
    return run


def jsonl_series(run: Path) -> dict[str, dict[int, float]]:
    series: dict[str, dict[int, float]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key != "step":
                series.setdefault(key, {})[record["step"]] = value
    return series


def check_series(got: dict[str, list[tuple[int, float]]], run: Path, rel: float) -> None:
    """Every metric of metrics.jsonl, at every step exactly once, with the same values."""
    want = jsonl_series(run)
    assert set(ALL) <= set(want)
    for key in ALL:
        steps = [s for s, _ in got[key]]
        assert steps == sorted(set(steps)), f"{key}: a step twice or out of order: {steps}"
        assert steps == sorted(want[key]), key
        if key in COMPARED:
            values = dict(got[key])
            assert values == pytest.approx(want[key], rel=rel), key


# ------------------------------------------------------------------------- TensorBoard
def tensorboard_events(run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.mark.slow  # tiny runs, but each tracker starts a store or a service
def test_tensorboard_holds_the_metrics_config_and_command(resumed_run: Path):
    acc = tensorboard_events(resumed_run)
    got = {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]}
    check_series(got, resumed_run, rel=1e-6)  # TensorBoard stores float32
    texts = {
        t: [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(t)]
        for t in acc.Tags()["tensors"]
    }
    commands = texts["command/text_summary"]
    assert len(commands) == 2 and "pretrain" in commands[0] and "--resume" in commands[1]
    assert '"lr": 0.001' in texts["config/text_summary"][0]
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["train.lr"].number_value == 0.001
    assert hparams["model.n_layer"].number_value == 2


# ------------------------------------------------------------------------------- W&B
def wandb_records(run: Path) -> list:
    """Every record of the run's offline .wandb files, oldest segment first."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    records = []
    for file in sorted((run / "wandb").glob("offline-run-*/run-*.wandb")):
        store = datastore.DataStore()
        store.open_for_scan(str(file))
        while (data := store.scan_data()) is not None:
            records.append(wandb_internal_pb2.Record.FromString(data))
    return records


def wandb_history(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Each metric's (step, value) points over all of the run's offline segments."""
    got: dict[str, list[tuple[int, float]]] = {}
    for r in wandb_records(run):
        if r.WhichOneof("record_type") != "history":
            continue
        for item in r.history.item:
            key = item.key or "/".join(item.nested_key)
            if not key.startswith("_"):
                value = json.loads(item.value_json)
                got.setdefault(key, []).append((r.history.step.num, value))
    return got


@pytest.mark.slow  # tiny runs, but each tracker starts a store or a service
def test_wandb_offline_files_hold_the_metrics_config_and_command(resumed_run: Path):
    records = wandb_records(resumed_run)
    run_id = json.loads((resumed_run / trackers.RECORD_FILE).read_text())["wandb"]["id"]
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert len(runs) == 2 and {r.run_id for r in runs} == {run_id}  # one run, two segments
    assert "pretrain" in runs[0].notes and "--resume" in runs[1].notes
    config = {item.key: json.loads(item.value_json) for item in runs[0].config.update}
    assert config["train"]["lr"] == 0.001 and config["model"]["n_layer"] == 2
    check_series(wandb_history(resumed_run), resumed_run, rel=1e-12)


# ---------------------------------------------------------------------------- MLflow
@pytest.mark.slow  # tiny runs, but each tracker starts a store or a service
def test_mlflow_store_holds_the_metrics_params_and_command(resumed_run: Path):
    from mlflow.tracking import MlflowClient

    record = json.loads((resumed_run / trackers.RECORD_FILE).read_text())["mlflow"]
    assert record["tracking_uri"] == f"sqlite:///{(resumed_run / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == resumed_run.name
    assert run.data.params["train.lr"] == "0.001" and run.data.params["model.n_layer"] == "2"
    assert "pretrain" in run.data.tags["gpt1.command"]
    assert "--resume" in run.data.tags["gpt1.command.resume_at_3"]
    got = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        for key in run.data.metrics
    }
    check_series(got, resumed_run, rel=1e-12)
    assert len(client.search_runs([run.info.experiment_id])) == 1  # resumed, not a new run


@pytest.mark.slow  # tiny runs, but each tracker starts a store or a service
def test_a_tracker_first_named_on_resume_gets_the_whole_run(
    tmp_path: Path, tiny_corpus: Path, offline_wandb
):
    """A run started without trackers and resumed with --logger: the new tracker run gets the
    kept history first, then the replayed and new steps, each step once."""
    run = tmp_path / "run"
    assert main(pretrain_args(tiny_corpus, run, 6, loggers=[])) == 0
    assert not (run / trackers.RECORD_FILE).exists()
    resume = ["--resume", str(run / "step-3")]
    added = ["--logger", "tensorboard", "--logger", "wandb"]
    assert main(pretrain_args(tiny_corpus, run, 8, *resume, loggers=added)) == 0
    acc = tensorboard_events(run)
    check_series(
        {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]},
        run,
        rel=1e-6,
    )
    check_series(wandb_history(run), run, rel=1e-12)


# ------------------------------------------------------------------- refusals and names
def test_missing_tracker_package_is_one_line_error_before_anything(
    tmp_path: Path, tiny_corpus: Path, monkeypatch, capsys
):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(
        trackers.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wandb" else real(name, *a),
    )
    out = tmp_path / "run"
    assert main([*tiny_pretrain(tiny_corpus, out), "--logger", "wandb"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert (
        "--logger wandb needs the wandb package" in err[0] and "pip install -e '.[track]'" in err[0]
    )
    assert not out.exists()  # refused before the run folder was made


def test_unknown_logger_names_the_choices():
    from gpt1.config import TrainConfig
    from gpt1.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown logger 'neptune'.*jsonl, tensorboard"):
        TrainConfig(loggers="jsonl,neptune")
    assert trackers.parse_loggers("jsonl, TensorBoard,jsonl") == ("jsonl", "tensorboard")


def test_command_line_reads_as_typed():
    argv = ["/x/gpt1/__main__.py", "pretrain", "--out", "runs/a b"]
    assert trackers.command_line(argv) == "gpt1 pretrain --out 'runs/a b'"


@pytest.mark.slow  # tiny runs, but each tracker starts a store or a service
def test_finetune_sends_task_metrics_and_final_results(tmp_path: Path, tiny_corpus: Path):
    """Fine-tuning: the periodic task metrics (as in metrics.jsonl), the final results.json
    figures at the last step, and the fine-tuning config as hyper-parameters."""

    task = make_task(tmp_path / "task")
    run = tmp_path / "ft"
    args = tiny_finetune(task, tiny_corpus, run, 4, "--eval-every", "2")
    assert main(["--quiet", *args, "--logger", "tensorboard"]) == 0
    acc = tensorboard_events(run)
    scalars = {k: [(e.step, e.value) for e in acc.Scalars(k)] for k in acc.Tags()["scalars"]}
    want = jsonl_series(run)
    assert "dev_accuracy" in want and "loss" in want
    for key in ("loss", "dev_accuracy"):
        assert dict(scalars[key]) == pytest.approx(want[key], rel=1e-6), key
    results = json.loads((run / "results.json").read_text())
    assert scalars["final/accuracy"] == [(4, pytest.approx(results["accuracy"], rel=1e-6))]
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    from tensorboard.plugins.hparams import plugin_data_pb2

    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["finetune.task"].string_value == "tsv"
    assert hparams["train.max_steps"].number_value == 4


@pytest.mark.slow  # creates an MLflow SQLite store
def test_mlflow_store_and_experiment_are_settings(tmp_path: Path, monkeypatch):
    """train.mlflow_uri (else MLFLOW_TRACKING_URI) chooses the store, train.tracker_project
    the experiment; the interface alone, no training."""
    from mlflow.tracking import MlflowClient

    elsewhere = f"sqlite:///{tmp_path / 'team.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'ignored.db'}")
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # nothing may land beside the current folder
    t = trackers.Trackers(
        run, "mlflow", config={"train": {"lr": 0.5}}, project="sweeps", mlflow_uri=elsewhere
    )
    t.open(None)
    t.log({"step": 1, "loss": 2.5, "note": "not a number"})
    t.close()
    record = json.loads((run / trackers.RECORD_FILE).read_text())["mlflow"]
    assert record["tracking_uri"] == elsewhere and not (tmp_path / "ignored.db").exists()
    client = MlflowClient(tracking_uri=elsewhere)
    found = client.get_run(record["run_id"])
    assert client.get_experiment(found.info.experiment_id).name == "sweeps"
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "loss")] == [
        (1, 2.5)
    ]
    assert set(found.data.metrics) == {"loss"} and found.data.params == {"train.lr": "0.5"}
    assert list((tmp_path / "cwd").iterdir()) == []


def test_a_failing_tracker_is_dropped_and_the_others_go_on(tmp_path: Path, caplog):
    class Fake:
        def __init__(self, name: str, fail: bool):
            self.name, self.fail, self.seen = name, fail, []

        def log(self, values, step):
            if self.fail:
                raise ConnectionError("server went away\nsecond line")
            self.seen.append((step, values))

        def close(self, status):
            self.seen.append(status)

    t = trackers.Trackers(tmp_path, "jsonl")
    bad, good = Fake("mlflow", True), Fake("tensorboard", False)
    t.open_ones = [bad, good]
    t.log({"step": 1, "loss": 1.0})
    t.log({"step": 2, "loss": 0.5})
    t.close("FINISHED")
    assert good.seen == [(1, {"loss": 1.0}), (2, {"loss": 0.5}), "FINISHED"]
    assert bad.seen == [] and t.open_ones == []
    warnings = [
        r.getMessage() for r in caplog.records if "--logger mlflow failed" in r.getMessage()
    ]
    assert warnings == [
        "--logger mlflow failed (server went away); it is dropped, metrics.jsonl continues"
    ]


def test_wandb_goes_online_only_with_an_account(tmp_path: Path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    assert trackers._wandb_mode() == "offline"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password KEY\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert trackers._wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert trackers._wandb_mode() == "offline"
    monkeypatch.delenv("WANDB_MODE")
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert trackers._wandb_mode() == "online"


@pytest.mark.slow
def test_sigkill_then_resume_auto_keeps_one_tracker_run_without_repeats(
    tmp_path: Path, tiny_corpus: Path
):
    """A real kill: the run dies at an arbitrary point past its step-6 checkpoint, `--resume
    auto` replays from the checkpoint; the TensorBoard events (flushed at every record) hold
    each step at most once, all but at most the one a kill can catch between metrics.jsonl and
    the tracker. (MLflow's and W&B's skipping is the deterministic test's above.)"""
    import signal
    import subprocess
    import time

    run = tmp_path / "run"
    flags = ("--save-every", "6", "--eval-every", "10", "--logger", "tensorboard")
    argv = gpt1_process(*tiny_pretrain(tiny_corpus, run, 20, *flags))
    proc = subprocess.Popen(argv, env=subprocess_env(), stderr=subprocess.PIPE, text=True)
    end = time.time() + 300
    while not (run / "step-6").is_dir() and proc.poll() is None and time.time() < end:
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "final").exists()
    logged_before_kill = max(json.loads(l)["step"] for l in (run / "metrics.jsonl").open())
    again = subprocess.run([*argv, "--resume", "auto"], env=subprocess_env(), capture_output=True)
    assert again.returncode == 0, again.stderr[-2000:]
    want = jsonl_series(run)
    acc = tensorboard_events(run)
    for key in ("loss", "val_loss"):
        points = [(e.step, e.value) for e in acc.Scalars(key)]
        steps = [s for s, _ in points]
        assert steps == sorted(set(steps)), f"{key}: a step twice: {steps}"
        assert len(set(want[key]) - set(steps)) <= 1, f"{key}: {steps}"
        assert dict(points) == pytest.approx({s: want[key][s] for s in steps}, rel=1e-6)
    assert logged_before_kill >= 6 and max(want["loss"]) == 20
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one per start
