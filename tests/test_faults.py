"""Crash safety: SIGKILL at random moments (also mid-checkpoint) then `--resume auto` equals an
uninterrupted run, for `gpt1 pretrain` and `gpt1 finetune`; a full disk while saving keeps the
previous checkpoint and says so; NaN/inf loss or gradients stop with advice and keep the last
good checkpoint; running out of memory names the flags to change.

The kill loops and fault cases live in tests/helpers (benchmarks/faults.py runs more kills)."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest
import torch

from gpt1 import checkpoint_files, files
from gpt1.config import TrainConfig, model_preset
from gpt1.errors import CheckpointError, Gpt1Error
from gpt1.model import checkpoint as ckpt
from gpt1.model.gpt import GPT
from gpt1.text.windows import WindowSource, open_prepared
from gpt1.train import state as train_state
from gpt1.train.loop import OutOfMemory, TrainingDiverged, train
from gpt1.train.objectives import WindowLMLoss
from helpers import fault_cases, faults
from helpers.tiny import gpt1_process, make_corpus, subprocess_env, tiny_pretrain


# ------------------------------------------------------------------------------ kill loops
@pytest.mark.slow
def test_pretrain_survives_sigkills_and_equals_uninterrupted(tmp_path):
    report = faults.pretrain_faults(tmp_path, kills=4, seed=1, steps=24)
    assert report.problems == [] and report.data_lost == 0
    assert report.kills >= 2, "the runs finished before they could be killed"
    assert report.checkpoints_verified > 0
    leftovers = [p.name for p in (tmp_path / "pre-kill").iterdir() if p.name.startswith(".step-")]
    assert leftovers == []  # torn folders of killed processes are cleaned up
    assert (tmp_path / "pre-kill" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_finetune_survives_sigkills_and_equals_uninterrupted(tmp_path):
    report = faults.finetune_faults(tmp_path, kills=3, seed=2, steps=24)
    assert report.problems == [] and report.data_lost == 0
    assert report.kills >= 2, "the runs finished before they could be killed"
    results = json.loads((tmp_path / "ft-kill" / "results.json").read_text())
    assert results["steps"] == 24 and 0.0 <= results["accuracy"] <= 1.0


def test_kill_mid_checkpoint_leaves_previous_intact(tmp_path, monkeypatch):
    """The moment a kill can hurt most -- between the first file of a checkpoint and its
    publication -- is simulated in-process: the half-written folder is invisible to resume."""
    run = tmp_path / "run"
    calls = {"n": 0}
    real = train_state.save_training_state

    def dies_in_second_save(folder, tensors, info):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # stands in for the process dying here
        real(folder, tensors, info)

    monkeypatch.setattr(train_state, "save_training_state", dies_in_second_save)
    # A dying process cleans nothing up (an exception, Ctrl-C included, would remove the torn
    # folder: tests/test_files.py checks that).
    monkeypatch.setattr(files, "remove", lambda path: None)
    with pytest.raises(KeyboardInterrupt):
        tiny_train(tmp_path, run, max_steps=4, save_every=2)
    assert [p.name for p in train_state.step_dirs(run)] == ["step-2"]
    assert any(".step-4.tmp-" in p.name for p in run.iterdir())  # the torn write
    assert train_state.latest_resumable(run) == run / "step-2"
    ckpt.load_checkpoint(run / "step-2")


# ----------------------------------------------------------------------- in-process helpers
def tiny_train(tmp: Path, run: Path, loss_fn=None, **overrides) -> object:
    data = tmp / "data"
    if not (data / "meta.json").is_file():
        make_corpus(data)
    prepared = open_prepared(data)
    cfg = TrainConfig(
        **{
            "batch_size": 4,
            "micro_batch_size": 2,
            "lr": 1e-3,
            "warmup": 2,
            "max_steps": 6,
            "save_every": 2,
            "eval_every": 0,
            "log_every": 1,
            "quiet": True,
            "peak_flops": 1.0,
            "device": "cpu",
            **overrides,
        }
    )
    torch.manual_seed(0)
    config = model_preset("tiny").derive(vocab_size=prepared.vocab_size)
    source = WindowSource(prepared.splits["train"], 32, cfg.seed)
    return train(GPT(config), loss_fn or WindowLMLoss(), source, cfg, run)


class FaultyLoss:
    """The real LM loss, with a fault injected at optimizer step `at` (1-based)."""

    def __init__(self, at: int, kind: str, accum: int = 2):
        self.at, self.kind, self.accum, self.calls = at, kind, accum, 0
        self.base = WindowLMLoss()

    def __call__(self, model, batch):
        self.calls += 1
        loss, info = self.base(model, batch)
        if (self.calls - 1) // self.accum + 1 != self.at:
            return loss, info
        if self.kind == "nan":
            return loss * float("nan"), info
        if self.kind == "inf":
            return loss + float("inf"), info
        if self.kind == "inf_grad":
            return _InfGrad.apply(loss), info
        if self.kind == "oom_cuda":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        if self.kind == "oom_cpu":
            torch.empty(2**62, dtype=torch.uint8)  # a real allocation no machine can serve
        return loss, info


class _InfGrad(torch.autograd.Function):
    """Identity forward (the loss stays finite), infinite gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("inf")


# ------------------------------------------------------------------------------- full disk
def test_full_disk_while_saving_keeps_previous_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    real = checkpoint_files.save_file
    state = {"n": 0}

    def fills_the_disk(tensors, filename, metadata=None):
        state["n"] += 1
        if state["n"] <= 2:  # step-2: weights + trainer state fit
            return real(tensors, filename, metadata=metadata)
        Path(filename).write_bytes(b"\0" * 1000)  # part of the file, then ENOSPC
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    monkeypatch.setattr(checkpoint_files, "save_file", fills_the_disk)
    with pytest.raises(CheckpointError) as err:
        tiny_train(tmp_path, run, max_steps=6, save_every=2)
    message = str(err.value)
    assert "No space left on device" in message and "step-4" in message
    assert "step-2 is intact" in message and "--resume auto" in message
    assert [p.name for p in train_state.step_dirs(run)] == ["step-2"]
    assert not [p for p in run.iterdir() if ".tmp-" in p.name]  # the torn folder is removed
    model = ckpt.load_checkpoint(run / "step-2")
    _, meta = train_state.load_training_state(run / "step-2")
    assert meta["step"] == 2 and model.config.vocab_size == 300
    # with space again, the run resumes from step-2 and finishes
    monkeypatch.setattr(checkpoint_files, "save_file", real)
    result = tiny_train(tmp_path, run, max_steps=6, save_every=2, resume="auto")
    assert result.step == 6 and (run / "final" / "model.safetensors").is_file()


def test_full_disk_through_the_cli_is_one_line(tmp_path, monkeypatch, capsys):
    from gpt1.cli import main

    data = make_corpus(tmp_path / "data")

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_files, "save_file", no_space)
    code = main(["--quiet", *tiny_pretrain(data, tmp_path / "run", 2)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "No space left on device" in err[0] and "no earlier checkpoint" in err[0]


# --------------------------------------------------------------------------------- NaN/inf
@pytest.mark.parametrize("kind", ["nan", "inf", "inf_grad"])
def test_nonfinite_loss_or_gradient_stops_with_advice(tmp_path, kind):
    run = tmp_path / "run"
    with pytest.raises(TrainingDiverged) as err:
        tiny_train(tmp_path, run, FaultyLoss(at=5, kind=kind), max_steps=8, save_every=2)
    message = str(err.value)
    assert "diverged at step 5" in message and "train.lr" in message
    assert str(run / "step-4") in message
    assert [p.name for p in train_state.step_dirs(run)] == ["step-2", "step-4"]
    assert not (run / "final").exists() and not (run / "step-5").exists()
    model = ckpt.load_checkpoint(run / "step-4")
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.slow
def test_divergence_through_the_cli(tmp_path):
    """A real divergence (absurd learning rate, no clipping): exit 2, one line of advice."""
    data = make_corpus(tmp_path / "data")
    run = tmp_path / "run"
    diverging = ("--lr", "1e30", "--set", "train.grad_clip=0", "--set", "train.warmup=0")
    cmd = gpt1_process(*tiny_pretrain(data, run, 20, *diverging))
    done = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "training diverged" in done.stderr and "Lower train.lr" in done.stderr
    assert not (run / "final").exists()
    last = train_state.latest_resumable(run)
    if last is not None:  # whatever was saved before the NaN still loads
        ckpt.load_checkpoint(last)


# ---------------------------------------------------------------------------- out of memory
@pytest.mark.parametrize("kind", ["oom_cuda", "oom_cpu"])
def test_out_of_memory_names_the_flags(tmp_path, kind):
    run = tmp_path / "run"
    with pytest.raises(OutOfMemory) as err:
        tiny_train(tmp_path, run, FaultyLoss(at=3, kind=kind), max_steps=6, save_every=2)
    message = str(err.value)
    assert isinstance(err.value, Gpt1Error)
    assert "--micro-batch 2" in message and "--micro-batch (e.g. 1)" in message
    assert "from 2 to 4" in message and "--batch-size 4" in message
    assert train_state.latest_resumable(run) == run / "step-2"


def test_other_runtime_errors_are_not_reported_as_oom(tmp_path):
    def broken(model, batch):
        raise RuntimeError("shape mismatch: a bug, not memory")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        tiny_train(tmp_path, tmp_path / "run", broken)


# ---------------------------------------------------------------------------- fault cases
def cases_named(*names: str) -> list:
    """The (row name, case) pairs of the fault table whose functions are `names`."""
    found = [(name, case) for name, case in fault_cases.CASES if case.__name__ in names]
    assert len(found) == len(names), "a case named here is not in the table"
    return found


DISK_CASES = cases_named(
    "disk_full_while_checkpointing",
    "read_only_run_folder",
    "disk_full_while_converting",
    "read_only_export_and_results_folders",
)


@pytest.mark.parametrize("name,case", DISK_CASES, ids=[c.__name__ for _, c in DISK_CASES])
@pytest.mark.parametrize("real", [True, False], ids=["real-tmpfs", "simulated"])
def test_disk_fault_cases(tmp_path, monkeypatch, name, case, real):
    """A full disk and a read-only folder: real private tmpfs mounts where `unshare -rm` works
    (skipped elsewhere), and the same faults raised from the writer everywhere."""
    if real and not fault_cases.private_mounts():
        pytest.skip("no unprivileged private mounts here (unshare -rm)")
    monkeypatch.setitem(fault_cases._MOUNTS, "ok", real)
    result = case(tmp_path)
    assert result.problems == () and result.data_lost == 0, result.outcome
    assert ("simulated" in result.outcome) != real


CHECK_CASES = cases_named(
    "billion_layers_in_a_checkpoint",
    "mistyped_sizes_in_a_checkpoint",
    "billion_layers_in_an_hf_config",
    "huge_n_outputs",
    "nan_weights",
    "token_id_beyond_the_vocabulary",
    "hf_index_outside_its_folder",
    "strict_readers",
    "serve_refuses_bad_options",
    "options_out_of_range",
)


@pytest.mark.parametrize("name,case", CHECK_CASES, ids=[c.__name__ for _, c in CHECK_CASES])
def test_validation_and_reader_fault_cases(tmp_path, monkeypatch, name, case):
    """The table's hostile-file rows: each command exits 2 with one line naming the file and
    field, and writes nothing (speed is the benchmark's business, not the test's)."""
    monkeypatch.setattr(fault_cases, "CHECK_TIMES", False)
    result = case(tmp_path)
    assert result.problems == () and result.data_lost == 0, result.outcome


@pytest.mark.slow
def test_half_sent_requests_flood_case(tmp_path):
    pytest.importorskip("uvicorn")
    result = fault_cases.half_sent_requests_flood(tmp_path)
    assert result.problems == (), result.outcome


def test_every_fault_case_is_listed_once():
    names = [case.__name__ for _, case in fault_cases.CASES]
    assert len(names) == len(set(names)) >= 21
