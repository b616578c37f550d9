"""The write policy (`gpt1.files`): nothing replaced without --overwrite, one writer per run folder,
write failures as one line with nothing left behind, files that follow the umask.

The end-to-end fault cases (real commands, real full disks where the machine allows) run in
tests/test_faults.py through `helpers.fault_cases`."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gpt1 import checkpoint_files, files
from gpt1.cli import main
from gpt1.model import checkpoint as ckpt
from gpt1.train import state as train_state
from helpers import fault_cases
from helpers.fault_cases import leftovers, snapshot
from helpers.tiny import (
    char_vocab,
    gpt1_process,
    make_corpus,
    make_task,
    subprocess_env,
    tiny_checkpoint,
    tiny_finetune,
    tiny_pretrain,
)


def cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(["--quiet", *argv])
    return code, capsys.readouterr().err.strip()


# ------------------------------------------------------------------------ overwrite policy
def test_check_output_refuses_existing_unless_overwrite(tmp_path):
    files.check_output(tmp_path / "new", False)  # absent: fine
    (tmp_path / "empty").mkdir()
    files.check_output(tmp_path / "empty", False)  # empty folder: fine
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "a.txt").write_text("x")
    with pytest.raises(files.OutputExists, match="--overwrite"):
        files.check_output(tmp_path / "full", False)
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(files.OutputExists, match="--overwrite"):
        files.check_output(tmp_path / "f.json", False)
    files.check_output(tmp_path / "full", True)
    # An output under a file (`--out notes.txt` where a folder is meant) says so, with or
    # without --overwrite, and leaves the file as it was.
    for below in (tmp_path / "f.json" / "results.json", tmp_path / "f.json" / "a" / "b.tsv"):
        for overwrite in (False, True):
            with pytest.raises(files.OutputExists, match=r"f\.json is a file, not a folder"):
                files.check_output(below, overwrite)
    assert (tmp_path / "f.json").read_text() == "{}"


def test_overwrite_never_replaces_the_source_or_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "run" / "final").mkdir(parents=True)
    with pytest.raises(files.OutputExists, match="holds .*an input of this command"):
        files.check_output(tmp_path / "run", True, (tmp_path / "run" / "final",))
    monkeypatch.chdir(tmp_path / "run" / "final")
    for dst in (".", "..", "/"):
        with pytest.raises(files.OutputExists, match="current folder"):
            files.check_output(dst, True)


def test_convert_keeps_an_existing_destination(tmp_path, capsys):
    """`convert SRC DST` onto an existing DST keeps DST's contents (it must never empty it)."""
    src = tiny_checkpoint(tmp_path / "ckpt")
    dst = tmp_path / "v"
    (dst / "sub").mkdir(parents=True)
    (dst / "thesis.txt").write_text("precious\n")
    before = snapshot(dst)
    code, err = cli(capsys, "convert", str(src), str(dst), "--from", "gpt1")
    assert code == 2 and len(err.splitlines()) == 1 and "--overwrite" in err and str(dst) in err
    assert snapshot(dst) == before and (dst / "sub").is_dir()
    # with --overwrite the folder is replaced by the converted checkpoint
    code, err = cli(capsys, "convert", str(src), str(dst), "--from", "gpt1", "--overwrite")
    assert code == 0, err
    assert not (dst / "thesis.txt").exists() and (dst / "model.safetensors").is_file()
    assert leftovers(tmp_path) == []


def test_convert_refuses_its_own_run_and_the_current_folder(tmp_path, capsys, monkeypatch):
    run = tmp_path / "rc"
    tiny_checkpoint(run / "final")
    before = snapshot(run)
    code, err = cli(
        capsys, "convert", str(run / "final"), str(run), "--from", "gpt1", "--overwrite"
    )
    assert code == 2 and "an input of this command" in err and snapshot(run) == before
    here = tmp_path / "here"
    here.mkdir()
    (here / "mine.txt").write_text("mine")
    monkeypatch.chdir(here)
    for dst in (".", ".."):
        for flags in ([], ["--overwrite"]):
            code, err = cli(capsys, "convert", str(run / "final"), dst, "--from", "gpt1", *flags)
            assert code == 2 and len(err.splitlines()) == 1, err
    assert (here / "mine.txt").read_text() == "mine" and snapshot(run) == before
    assert leftovers(tmp_path) == []


@pytest.fixture
def prepared(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus"))


def test_pretrain_refuses_a_folder_without_checkpoints(tmp_path, prepared, capsys):
    """An existing run folder with no checkpoint to resume is refused: its metrics.jsonl, run.json,
    results.json and plots are never replaced silently."""
    out = tmp_path / "run"
    out.mkdir()
    for name in ("metrics.jsonl", "run.json", "results.json", "loss.png"):
        (out / name).write_text(f"the user's {name}\n")
    before = snapshot(out)
    code, err = cli(capsys, *tiny_pretrain(prepared, out))
    assert code == 2 and len(err.splitlines()) == 1
    assert "--resume auto" in err and "--overwrite" in err and "metrics.jsonl" in err
    assert snapshot(out) == before
    # --overwrite starts over; --resume and --overwrite together are refused
    code, err = cli(capsys, *tiny_pretrain(prepared, out, 2, "--resume", "auto", "--overwrite"))
    assert code == 2 and "exclude each other" in err
    code, err = cli(capsys, *tiny_pretrain(prepared, out, 2, "--overwrite"))
    assert code == 0, err
    assert not (out / "results.json").exists() and (out / "final").is_dir()
    assert "the user's" not in (out / "metrics.jsonl").read_text()


def test_evaluate_predict_plot_name_their_files_and_never_overwrite(tmp_path, capsys):
    """Each split's predictions get their own file: predict --split dev never replaces the test
    predictions, and no command overwrites a file it did not create."""
    task, vocab = make_task(tmp_path / "task"), char_vocab(tmp_path / "vocab")
    (task / "test.tsv").write_text((task / "dev.tsv").read_text())
    run = tmp_path / "ft"
    code, err = cli(capsys, *tiny_finetune(task, vocab, run, 2))
    assert code == 0, err
    finetuned = (run / "results.json").read_text()
    assert cli(capsys, "predict", str(run), "--data", str(task))[0] == 0
    test_file = (run / "submission" / "tsv.tsv").read_text()
    assert cli(capsys, "predict", str(run), "--data", str(task), "--split", "dev")[0] == 0
    assert (run / "submission" / "tsv.tsv").read_text() == test_file
    assert (run / "submission" / "tsv.dev.tsv").read_text().startswith("index\tprediction\n")
    assert cli(capsys, "evaluate", str(run), "--data", str(task))[0] == 0
    assert json.loads((run / "results.dev.json").read_text())["split"] == "dev"
    assert (run / "results.json").read_text() == finetuned
    assert cli(capsys, "plot", str(run))[0] == 0
    before = snapshot(run)
    for argv in (
        ["predict", str(run), "--data", str(task)],
        ["predict", str(run), "--data", str(task), "--split", "dev"],
        ["evaluate", str(run), "--data", str(task)],
        ["plot", str(run)],
    ):
        code, err = cli(capsys, *argv)
        assert code == 2 and "--overwrite" in err and len(err.splitlines()) == 1, (argv, err)
    assert snapshot(run) == before
    code, err = cli(capsys, "evaluate", str(run), "--data", str(task), "--overwrite")
    assert code == 0, err
    # A run folder the user may only read: --out puts the results elsewhere.
    before = snapshot(run)
    os.chmod(run, 0o555)
    try:
        if not os.access(run, os.W_OK):  # root writes anyway: nothing to refuse then
            code, err = cli(capsys, "evaluate", str(run), "--data", str(task), "--split", "test")
            assert code == 2 and len(err.splitlines()) == 1 and str(run) in err, err
        code, err = cli(
            capsys,
            "evaluate",
            str(run),
            "--data",
            str(task),
            "--split",
            "test",
            "--out",
            str(tmp_path / "scores"),
        )
        assert code == 0, err
    finally:
        os.chmod(run, 0o755)
    assert json.loads((tmp_path / "scores" / "results.test.json").read_text())["split"] == "test"
    assert snapshot(run) == before
    if fault_cases.private_mounts():  # a really read-only mount (root ignores file modes)
        ro = tmp_path / "ro"
        evaluate = [
            sys.executable,
            "-m",
            "gpt1",
            "--quiet",
            "evaluate",
            str(ro / "ft"),
            "--data",
            str(task),
            "--split",
            "train",
        ]
        script = (
            f"cp -a {run} {ro}/ft && mount -o remount,ro {ro} && "
            f"{{ {shlex.join(evaluate)}; echo rc=$?; }} && "
            f"{shlex.join(evaluate + ['--out', str(tmp_path / 'scores')])}"
        )
        done = fault_cases._in_tmpfs(ro, "size=64m", script)
        assert done.returncode == 0, done.stderr[-2000:]
        refusal = [line for line in done.stderr.splitlines() if "error" in line]
        assert "rc=2" in done.stdout and len(refusal) == 1 and "Read-only" in refusal[0], (
            done.stderr
        )
        assert (tmp_path / "scores" / "results.train.json").is_file()


def test_zeroshot_keeps_an_existing_results_file(tmp_path, capsys):
    src = tiny_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "zs"
    out.mkdir()
    (out / "results.json").write_text('{"mine": true}\n')
    code, err = cli(
        capsys, "zeroshot", str(src), "--task", "sst2", "--data", str(tmp_path), "--out", str(out)
    )
    assert (
        code == 2
        and "--overwrite" in err
        and (out / "results.json").read_text() == '{"mine": true}\n'
    )


def test_prepare_and_tokenizer_share_the_policy(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world. " * 50)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    code, err = cli(
        capsys, "tokenizer", "train", "--corpus", str(corpus), "--merges", "10", "--out", str(out)
    )
    assert code == 2 and "--overwrite" in err and "keep.txt" in err
    code, err = cli(
        capsys,
        "tokenizer",
        "train",
        "--corpus",
        str(corpus),
        "--merges",
        "10",
        "--out",
        str(tmp_path),
        "--overwrite",
    )  # holds the corpus
    assert code == 2 and "an input of this command" in err and corpus.is_file()
    code, err = cli(
        capsys,
        "prepare",
        "--corpus",
        str(corpus),
        "--vocab",
        str(char_vocab(tmp_path / "vocab")),
        "--out",
        str(out),
    )
    assert code == 2 and "--overwrite" in err and (out / "keep.txt").read_text() == "keep"


# ------------------------------------------------------------------------------ run lock
def test_lock_names_its_holder_and_is_released(tmp_path):
    with files.RunLock(tmp_path, "gpt1 pretrain --out x"):
        with pytest.raises(files.RunLocked) as err:
            files.RunLock(tmp_path).acquire()
        message = str(err.value)
        assert f"pid {os.getpid()}" in message and "gpt1 pretrain --out x" in message
        assert "since 20" in message
    with files.RunLock(tmp_path):  # released: the next holder gets it
        pass
    assert files.is_empty(tmp_path)  # only the (empty) lock file stays


def test_second_pretrain_is_refused_and_metrics_not_duplicated(tmp_path, prepared):
    """Two processes on one run folder: the second is refused by the run lock, so no step of
    metrics.jsonl is written twice."""
    run = tmp_path / "run"
    # The first run is long enough to outlive the second's start-up on any machine, and is
    # stopped with SIGTERM (it saves and exits 143) once the second has been refused.
    extra = ("--log-every", "1", "--resume", "auto", "--set", "train.keep_last=2")
    argv = gpt1_process(*tiny_pretrain(prepared, run, 1_000_000, *extra))
    first = subprocess.Popen(argv, env=subprocess_env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text()):
            assert first.poll() is None and time.time() < deadline, first.stderr.read()
            time.sleep(0.02)
        second = subprocess.run(
            argv, env=subprocess_env(), capture_output=True, text=True, timeout=300
        )
        assert first.poll() is None
    finally:
        first.terminate()
        code = first.wait(timeout=600)
        first.stderr.close()
    assert code == 128 + 15
    err = second.stderr.strip()
    assert second.returncode == 2 and len(err.splitlines()) == 1, err
    assert "in use by another gpt1 process" in err and f"pid {first.pid}" in err
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) >= 1 and steps == list(range(1, len(steps) + 1))  # none twice


def test_sigkilled_holder_does_not_block_the_next_run(tmp_path, prepared, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from gpt1.files import "
            "RunLock; RunLock(sys.argv[1]).acquire(); print('held', flush=True); "
            "time.sleep(600)",
            str(run),
        ],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    code, err = cli(capsys, *tiny_pretrain(prepared, run, 2, "--resume", "auto"))
    assert code == 2 and "in use" in err
    holder.kill()
    holder.wait()
    holder.stdout.close()
    code, err = cli(capsys, *tiny_pretrain(prepared, run, 2, "--resume", "auto"))
    assert code == 0, err
    assert (run / "final" / "model.safetensors").is_file()


# -------------------------------------------------------------------------- write failures
@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_checkpoint_write_failure_is_one_line_without_leftovers(
    tmp_path, prepared, capsys, monkeypatch, code
):
    """A full or read-only disk while checkpointing (including errors raised inside safetensors)
    is a clear error and leaves no half-written checkpoint."""
    from safetensors import SafetensorError

    real, calls = checkpoint_files.save_file, {"n": 0}

    def failing(tensors, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] <= 2:  # step-1 fits
            return real(tensors, filename, metadata=metadata)
        Path(filename).write_bytes(b"\0" * 100)
        if code == errno.ENOSPC:  # what safetensors raises on a full disk
            raise SafetensorError(
                "Error while serializing: IoError(Os { code: 28, kind: "
                'StorageFull, message: "No space left on device" })'
            )
        raise OSError(code, os.strerror(code), filename)

    monkeypatch.setattr(checkpoint_files, "save_file", failing)
    run = tmp_path / "run"
    exit_code, err = cli(capsys, *tiny_pretrain(prepared, run, 3))
    assert exit_code == 2 and len(err.splitlines()) == 1, err
    assert str(run / "step-2") in err and os.strerror(code) in err and "is intact" in err
    assert ("needs about" in err) == (code == errno.ENOSPC)
    assert [p.name for p in train_state.step_dirs(run)] == ["step-1"]
    assert leftovers(run) == []
    ckpt.load_checkpoint(run / "step-1")


def test_atomic_dir_mkdir_failure_is_a_write_error(tmp_path, monkeypatch):
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if ".tmp-" in self.name:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(files.WriteError, match="Read-only file system; needs a writable folder"):
        files.atomic_dir(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_atomic_file_write_failure_leaves_the_old_file(tmp_path, monkeypatch):
    target = files.write_json(tmp_path / "results.json", {"old": 1})
    real_replace = os.replace

    def no_space(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(os, "replace", no_space)
    with pytest.raises(files.WriteError, match="No space left on device; needs about"):
        files.write_json(target, {"new": 2})
    monkeypatch.setattr(os, "replace", real_replace)
    assert json.loads(target.read_text()) == {"old": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_read_errors_are_not_reported_as_write_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        with files.writing(tmp_path / "out"):
            open(tmp_path / "elsewhere" / "input.txt")


def test_save_model_write_failure_leaves_nothing(tmp_path, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_files, "save_file", no_space)
    with pytest.raises(files.WriteError, match=r"ckpt: could not write \(No space left"):
        tiny_checkpoint(tmp_path / "ckpt")
    assert leftovers(tmp_path) == [] and not (tmp_path / "ckpt").exists()


# ------------------------------------------------------------------------------- umask
@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_weights_follow_the_umask(tmp_path, mask):
    """Weights get the same umask-derived mode as the JSON files beside them, not the 0600 of
    safetensors' temporary file."""
    old = os.umask(mask)
    try:
        folder = tiny_checkpoint(tmp_path / "ckpt")
        train_state.save_training_state(folder, {"x": torch.zeros(2)}, {"step": 0})
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_resume_from_another_run_does_not_mix_into_a_used_folder(tmp_path, prepared, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(capsys, *tiny_pretrain(prepared, a, 2))[0] == 0
    b.mkdir()
    (b / "metrics.jsonl").write_text('{"step": 9, "loss": 1.0}\n')
    code, err = cli(capsys, *tiny_pretrain(prepared, b, 3, "--resume", str(a / "step-1")))
    assert code == 2 and "not empty" in err
    assert (b / "metrics.jsonl").read_text() == '{"step": 9, "loss": 1.0}\n'
    assert train_state.resumes_in(a, str(a / "step-1")) and train_state.resumes_in(a, "auto")
    assert not train_state.resumes_in(b, str(a / "step-1")) and not train_state.resumes_in(b, None)


def test_metrics_write_failure_is_one_line(tmp_path, prepared, capsys, monkeypatch):
    import builtins

    from gpt1.train import telemetry as metrics

    real_open = builtins.open

    def full_on_append(file, mode="r", *args, **kwargs):
        if str(file).endswith("metrics.jsonl") and "a" in mode:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(metrics, "open", full_on_append, raising=False)
    run = tmp_path / "run"
    code, err = cli(capsys, *tiny_pretrain(prepared, run, 2))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(run / "metrics.jsonl") in err and "No space left on device; needs about" in err
    assert leftovers(run) == []


# ----------------------------------------------------------------------- inputs are sacred
def test_check_inputs_compares_real_paths_in_both_directions(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "sub" / "a.txt").write_text("text")
    (tmp_path / "link").symlink_to(corpus)
    for out, src, how in (
        (corpus, corpus, "is"),
        (tmp_path / "link", corpus, "is"),  # a symlink to the input is the input
        (tmp_path, corpus, "holds"),
        (corpus / "sub", corpus, "lies inside"),  # exists: replacing it deletes input files
        (tmp_path / "link" / "sub", corpus, "lies inside"),
        (corpus / "sub" / "a.txt" / "x", corpus / "sub" / "a.txt", "lies inside"),  # in a file
    ):
        with pytest.raises(files.OutputIsInput, match=f": {how} .*an input of this command"):
            files.check_inputs(out, [src])
    files.check_inputs(corpus / "new", [corpus])  # a new output beside the input deletes nothing
    files.check_inputs(tmp_path / "elsewhere", [corpus, "hf:glue", None, ""])
    # A root (a checkpoint or task folder) is read only through its files: outputs beside them
    # are allowed, the folder itself and its files are not.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_text("weights")
    (ckpt / "results.json").write_text("{}")
    files.check_inputs(ckpt / "results.json", files.folder_files(ckpt)[:1], [ckpt])
    for out in (ckpt, tmp_path, ckpt / "model.safetensors"):
        with pytest.raises(files.OutputIsInput):
            files.check_output(out, True, files.folder_files(ckpt)[:1], [ckpt])


@pytest.mark.parametrize("name", list(fault_cases.ONTO_INPUTS))
def test_no_command_writes_onto_its_own_input(tmp_path, name):
    """Every writing command refuses an output that is, holds or lies inside one of its inputs,
    with or without --overwrite, in one line, and changes nothing on disk."""
    assert fault_cases.onto_an_input(tmp_path, name) == []


@pytest.mark.parametrize("name", list(fault_cases.LEAVES_NOTHING))
def test_a_refused_or_failed_run_leaves_nothing_behind(tmp_path, name):
    """No lock file, no new folder, run.json and checkpoints of a refused resume unchanged."""
    assert fault_cases.refusal_leaves_nothing(tmp_path, name) == []


INTERRUPTIONS = [
    pytest.param(name, sig, marks=[] if name == "convert --to hf" else [pytest.mark.slow])
    for name in fault_cases.INTERRUPTED
    for sig in (signal.SIGINT, signal.SIGTERM)
]


@pytest.mark.parametrize("name,sig", INTERRUPTIONS)
def test_an_interrupted_writer_leaves_no_temporary(tmp_path, name, sig):
    """Ctrl-C or SIGTERM between writing and publishing an output folder: exit 130 / 143 in
    one line, the hidden `.NAME.tmp-PID` folder removed, no output."""
    assert fault_cases.interrupted_write(tmp_path, name, sig) == []


def test_stale_temporaries_of_dead_processes_are_removed_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    final = tmp_path / "out"
    for pid in (dead.pid, os.getppid(), os.getpid()):
        (tmp_path / f".out.tmp-{pid}").mkdir()
    tmp = files.atomic_dir(final)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([f".out.tmp-{os.getppid()}", tmp.name]), names
