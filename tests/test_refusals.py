"""A refused resume leaves its run folder exactly as it was: every refusal path of `gpt1
pretrain` and `gpt1 finetune --resume` (settings, batch arithmetic, data, checkpoint, trackers,
lock) exits 2 with one line, and every file's bytes and modification time, every folder's
listing and modification time, are what they were (the lock file's time excepted: holding the
lock writes who holds it and empties it again)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

from gpt1.files import LOCK_FILE, RunLock
from helpers import fault_cases
from helpers.tiny import char_vocab, make_corpus, make_task, run_cli, tiny_pretrain


def fingerprint(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder` and the folder itself: kind, content hash, mtime."""
    found: dict[str, tuple] = {".": ("folder", folder.stat().st_mtime_ns)}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root) / name
            key, info = str(path.relative_to(folder)), path.lstat()
            if path.is_symlink():
                found[key] = ("link", os.readlink(path), info.st_mtime_ns)
            elif path.is_dir():
                found[key] = ("folder", info.st_mtime_ns)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[key] = ("file", digest, None if name == LOCK_FILE else info.st_mtime_ns)
    return found


def differences(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    return [
        f"{key}: {before.get(key, 'absent')} -> {after.get(key, 'absent')}"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]


# ------------------------------------------------------------------------------ the cases
# Each case: (its own work folder, a folder shared by the cases) -> (argv, run folder, words
# the one line must hold, context the command runs in). The run folder is prepared as the case
# needs (most are a copy of a finished 2-step run) before the fingerprint is taken.
Case = Callable[
    [Path, Path], tuple[list[str], Path, tuple[str, ...], contextlib.AbstractContextManager]
]


def _copy(work: Path, shared: Path, kind: str) -> tuple[Path, Callable[..., list[str]]]:
    """A copy in `work` of the finished `kind` run (trained once, in `shared`)."""
    first, argv_for = fault_cases._first_run(shared, kind)
    run = work / "run"
    shutil.copytree(first, run)
    return run, argv_for


def _resume(kind: str, *extra: str, must: tuple[str, ...], edit=None) -> Case:
    """Resume a copy of the finished `kind` run to 3 steps with `extra`, after `edit(run)`."""

    def case(work: Path, shared: Path):
        run, argv_for = _copy(work, shared, kind)
        if edit is not None:
            edit(run)
        return argv_for(run, 3, "--resume", "auto", *extra), run, must, contextlib.nullcontext()

    return case


def _setting(name: str) -> Case:
    """A case of `fault_cases.RESUME_REFUSED`: a setting the run may not change."""

    def case(work: Path, shared: Path):
        kind, extra, must = fault_cases.RESUME_REFUSED[name]
        if "OTHER" in extra:
            other = shared / f"other-{kind}"
            if not other.is_dir():
                fault_cases.other_data(other, kind)
            extra = tuple(str(other) if e == "OTHER" else e for e in extra)
        return _resume(kind, *extra, must=must)(work, shared)

    return case


def _damaged_trainer_state(run: Path) -> None:
    file = run / "step-2" / "trainer_state.json"
    state = json.loads(file.read_text())
    del state["optimizer"]
    file.write_text(json.dumps(state))


def _truncated_weights(run: Path) -> None:
    weights = run / "step-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def _tensorboard_folder_is_a_file(run: Path) -> None:
    (run / "tensorboard").write_text("not the events folder\n")


def _trackers_json_damaged(run: Path) -> None:
    (run / "trackers.json").write_text("{not json")


def _second_tracker_fails(run: Path) -> None:
    """TensorBoard starts (writes an event file), then MLflow cannot find its run."""
    records = {
        "tensorboard": {"logdir": "tensorboard"},
        "mlflow": {"run_id": "0" * 32, "tracking_uri": f"sqlite:///{run / 'mlflow.db'}"},
    }
    (run / "trackers.json").write_text(json.dumps(records))


@contextlib.contextmanager
def _broken_package(work: Path, name: str) -> Iterator[None]:
    """`name` importable from a folder first on sys.path, and failing when imported (as a
    package whose compiled part is missing)."""
    folder = work / "broken-packages"
    (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / name / "__init__.py").write_text(
        'raise ImportError("libmissing.so: cannot open shared object file")\n'
    )
    cached = {k: v for k, v in sys.modules.items() if k == name or k.startswith(name + ".")}
    with mock.patch.object(sys, "path", [str(folder), *sys.path]):
        with mock.patch.dict(sys.modules):
            for key in cached:
                del sys.modules[key]
            yield


def _broken_tracker(kind: str) -> Case:
    def case(work: Path, shared: Path):
        argv, run, must, _ = _resume(kind, "--logger", "wandb", must=must_words)(work, shared)
        return argv, run, must, _broken_package(work, "wandb")

    must_words = ("--logger wandb", "does not import", "libmissing.so")
    return case


@contextlib.contextmanager
def _locked(run: Path) -> Iterator[None]:
    lock = RunLock(run).acquire()
    try:
        yield
    finally:
        lock.release()


def _while_locked(kind: str) -> Case:
    def case(work: Path, shared: Path):
        argv, run, must, _ = _resume(kind, must=("in use by another gpt1 process",))(work, shared)
        return argv, run, must, _locked(run)

    return case


def _text_corpus(folder: Path, docs: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))


DOCS = [f"document {i:03d} says hello to all the world." for i in range(60)]


def _stream(change: Callable[[list[str], int], list[str]]) -> Case:
    """A 2-step run on text read directly (equal-length documents), resumed after its file
    was rewritten with `change(documents, number of the document at the cursor)`."""

    def case(work: Path, shared: Path):
        corpus, vocab, run = work / "text", char_vocab(work / "vocab"), work / "run"
        _text_corpus(corpus, DOCS)

        def argv(steps: int, *extra: str) -> list[str]:
            return tiny_pretrain(
                corpus, run, steps, "--tokenizer", str(vocab), "--set", "data.n_ctx=16", *extra
            )

        code, err = run_cli(argv(2))
        assert code == 0, err
        state = json.loads((run / "step-2" / "trainer_state.json").read_text())
        _text_corpus(corpus, change(DOCS, state["sources"][0]["doc"]))
        must = (str(corpus / "a.jsonl"), "the text changed since the checkpoint")
        return argv(3, "--resume", "auto"), run, must, contextlib.nullcontext()

    return case


def _longer_document_at_the_cursor(docs: list[str], position: int) -> list[str]:
    return [*docs[:position], docs[position] + " and then some", *docs[position + 1 :]]


CASES: dict[str, Case] = {
    **{f"setting: {name}": _setting(name) for name in fault_cases.RESUME_REFUSED},
    "pretrain --micro-batch 3 (batch 4)": _resume(
        "pretrain", "--micro-batch", "3", must=("micro_batch_size", "multiple")
    ),
    "finetune --micro-batch 3 (batch 4)": _resume(
        "finetune", "--micro-batch", "3", must=("micro_batch_size", "multiple")
    ),
    "pretrain: damaged trainer state": _resume(
        "pretrain", must=("damaged trainer state",), edit=_damaged_trainer_state
    ),
    "finetune: damaged trainer state": _resume(
        "finetune", must=("damaged trainer state",), edit=_damaged_trainer_state
    ),
    "pretrain: truncated weights": _resume(
        "pretrain", must=("model.safetensors",), edit=_truncated_weights
    ),
    "pretrain --logger tensorboard, its folder a file": _resume(
        "pretrain",
        "--logger",
        "tensorboard",
        must=("--logger tensorboard",),
        edit=_tensorboard_folder_is_a_file,
    ),
    "finetune --logger tensorboard, its folder a file": _resume(
        "finetune",
        "--logger",
        "tensorboard",
        must=("--logger tensorboard",),
        edit=_tensorboard_folder_is_a_file,
    ),
    "pretrain --logger tensorboard, trackers.json damaged": _resume(
        "pretrain",
        "--logger",
        "tensorboard",
        must=("trackers.json",),
        edit=_trackers_json_damaged,
    ),
    "pretrain --logger tensorboard --logger mlflow, MLflow's run gone": _resume(
        "pretrain",
        "--logger",
        "tensorboard",
        "--logger",
        "mlflow",
        must=("--logger mlflow",),
        edit=_second_tracker_fails,
    ),
    "pretrain --logger wandb, installed but broken": _broken_tracker("pretrain"),
    "finetune --logger wandb, installed but broken": _broken_tracker("finetune"),
    "pretrain while another process holds the run": _while_locked("pretrain"),
    "finetune while another process holds the run": _while_locked("finetune"),
    "pretrain --resume auto --overwrite": _resume(
        "pretrain", "--overwrite", must=("exclude each other",)
    ),
    "pretrain on text: a document inserted in front": _stream(lambda d, _: [d[0], *d]),
    "pretrain on text: the document at the cursor longer": _stream(_longer_document_at_the_cursor),
}


def test_every_refused_resume_leaves_the_run_folder_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    problems: list[str] = []
    for i, (name, case) in enumerate(CASES.items()):
        work = tmp_path / f"c{i:02d}"
        work.mkdir()
        argv, run, must, context = case(work, tmp_path / "shared")
        before = fingerprint(run)
        with context:
            code, err = run_cli(argv)
        problems += [f"{name}: {p}" for p in fault_cases.one_line(code, err, *must)]
        problems += [f"{name}: changed {d}" for d in differences(before, fingerprint(run))]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_a_broken_tracker_package_refuses_a_new_run_before_its_folder(tmp_path, command):
    """wandb installed but failing to import: refused in one line before --out is made, so the
    same command without the tracker then runs in that --out."""
    if command == "pretrain":
        argv = tiny_pretrain(make_corpus(tmp_path / "data"), tmp_path / "run", 1)
    else:
        argv = fault_cases.tiny_finetune(
            make_task(tmp_path / "task"), char_vocab(tmp_path / "vocab"), tmp_path / "run", 1
        )
    with _broken_package(tmp_path, "wandb"):
        code, err = run_cli([*argv, "--logger", "wandb"])
    assert fault_cases.one_line(code, err, "--logger wandb", "does not import") == []
    assert not (tmp_path / "run").exists()
    assert run_cli(argv) == (0, "")
