"""Fault cases: what a user's disk, a second process or a hostile file can do to a command, and
what it costs.

Each case is a function `case(work: Path) -> CaseResult` that sets up its own files under `work`,
runs real `gpt1` commands (in this process through `gpt1.cli.main`, or as subprocesses where a
second process or a kill is the point), and reports the outcome in words and how many of the
user's files or checkpoints were lost or damaged. `CASES` lists them in table order; to add a case,
write a function and append it (`tests/test_faults.py` runs the cases and asserts nothing lost).

A full disk and a read-only folder are real where the machine lets an unprivileged process mount a
private tmpfs (`unshare -rm`, Linux user namespaces); elsewhere the writer is made to raise the
same OSError (ENOSPC, EROFS), and the outcome says "(simulated)".
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from gpt1.config import ModelConfig
from gpt1.files import LOCK_FILE
from helpers.faults import verify_run
from helpers.tiny import (
    ODD_SIZES_MODEL,
    TORCHRUN_TWO_PROCESSES,
    char_vocab,
    gpt1_process,
    make_corpus,
    make_task,
    run_cli,
    subprocess_env,
    tiny_checkpoint,
    tiny_finetune,
    tiny_finetuned_run,
    tiny_pretrain,
)


@dataclass
class CaseResult:
    """One row of the fault table."""

    outcome: str  # what the command did, in words (exit status and message)
    data_lost: int = 0  # user files or checkpoints deleted, replaced or damaged
    problems: tuple[str, ...] = ()  # what went wrong, when something did


# ------------------------------------------------------------------------------ helpers
def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes), the lock file excepted."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def lost(before: dict[str, bytes], folder: Path) -> list[str]:
    """Files of `before` that are gone or changed under `folder`."""
    after = snapshot(folder) if folder.is_dir() else {}
    return [name for name, data in before.items() if after.get(name) != data]


def leftovers(folder: Path) -> list[str]:
    """Temporary names (`.X.tmp-PID`, `.X.old-PID`, `.X.deleting-PID`) under `folder`."""
    return [
        str(p.relative_to(folder))
        for p in folder.rglob(".*")
        if any(k in p.name for k in (".tmp-", ".old-", ".deleting-"))
    ]


def one_line(code: int, err: str, *must: str) -> list[str]:
    """Problems with a refusal: exit status 2, one stderr line, holding each of `must`."""
    problems = []
    if code != 2:
        problems.append(f"exit status {code}, expected 2")
    if len(err.splitlines()) != 1:
        problems.append(f"{len(err.splitlines())} stderr lines: {err[-300:]!r}")
    problems += [f"message lacks {m!r}: {err[:200]!r}" for m in must if m not in err]
    return problems


def result(outcome: str, lost_files: list[str], problems: list[str]) -> CaseResult:
    return CaseResult(
        outcome if not problems else outcome + " -- BUT " + "; ".join(problems),
        len(lost_files),
        tuple(problems + [f"lost {f}" for f in lost_files]),
    )


# --------------------------------------------------------------------------- overwrites
def convert_onto_a_users_folder(work: Path) -> CaseResult:
    ckpt = tiny_checkpoint(work / "ckpt")
    dst = work / "v"
    (dst / "sub").mkdir(parents=True)
    (dst / "thesis.txt").write_text("precious\n")
    (dst / "sub" / "notes.txt").write_text("also precious\n")
    before = snapshot(dst)
    code, err = run_cli(["convert", str(ckpt), str(dst), "--from", "gpt1"])
    return result(
        "refused (exit 2, one line: pass --overwrite)",
        lost(before, dst),
        one_line(code, err, str(dst), "--overwrite") + leftovers(work),
    )


def convert_over_its_own_run_with_overwrite(work: Path) -> CaseResult:
    run = work / "rc"
    tiny_checkpoint(run / "final")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    before = snapshot(run)
    code, err = run_cli(["convert", str(run / "final"), str(run), "--from", "gpt1", "--overwrite"])
    return result(
        "refused even with --overwrite (DST holds SRC)",
        lost(before, run),
        one_line(code, err, "an input of this command") + leftovers(work),
    )


def convert_onto_the_current_folder(work: Path) -> CaseResult:
    ckpt = tiny_checkpoint(work / "ckpt")
    here = work / "here" / "deeper"
    here.mkdir(parents=True)
    (here / "mine.txt").write_text("mine\n")
    before = snapshot(work / "here")
    problems: list[str] = []
    for dst in (".", ".."):
        for flags in ([], ["--overwrite"]):
            code, err = run_cli(["convert", str(ckpt), dst, "--from", "gpt1", *flags], cwd=here)
            problems += [f"{dst} {flags}: {p}" for p in one_line(code, err)]
    return result(
        "`.` and `..` refused, with and without --overwrite; no `..tmp-PID`",
        lost(before, work / "here"),
        problems + leftovers(work),
    )


def pretrain_into_a_used_folder(work: Path) -> CaseResult:
    data = make_corpus(work / "data")
    out = work / "run"
    out.mkdir()
    for name, text in (
        ("metrics.jsonl", '{"step": 7, "loss": 3.0}\n'),
        ("run.json", "{}\n"),
        ("results.json", '{"accuracy": 0.9}\n'),
        ("loss.png", "png"),
    ):
        (out / name).write_text(text)
    before = snapshot(out)
    code, err = run_cli(tiny_pretrain(data, out))
    problems = one_line(code, err, "--resume auto", "--overwrite")
    return result(
        "refused (exit 2): resume, --overwrite or a new --out", lost(before, out), problems
    )


def results_written_twice(work: Path) -> CaseResult:
    """evaluate, predict (test, then dev), plot and zeroshot: a second write needs --overwrite."""
    task, vocab = make_task(work / "task"), char_vocab(work / "vocab")
    (task / "test.tsv").write_text((task / "dev.tsv").read_text())
    run = work / "ft"
    ft = tiny_finetune(task, vocab, run, 2)
    code, err = run_cli(ft)
    problems = [f"finetune failed: {err[:300]}"] if code else []
    writes = {
        "evaluate": ["evaluate", str(run), "--data", str(task)],
        "predict test": ["predict", str(run), "--data", str(task)],
        "predict dev": ["predict", str(run), "--data", str(task), "--split", "dev"],
        "plot": ["plot", str(run)],
    }
    for name, argv in writes.items():
        code, err = run_cli(argv)
        if code:
            problems.append(f"first {name}: exit {code}: {err[:200]}")
    (work / "zs").mkdir()
    (work / "zs" / "results.json").write_text('{"mine": true}\n')
    writes["zeroshot"] = [
        "zeroshot",
        str(run / "final"),
        "--task",
        "sst2",
        "--data",
        str(task),
        "--out",
        str(work / "zs"),
    ]
    before = snapshot(work)
    for name, argv in writes.items():
        code, err = run_cli(argv)
        problems += [f"second {name}: {p}" for p in one_line(code, err, "--overwrite")]
    subs = sorted(p.name for p in (run / "submission").glob("*.tsv"))
    if subs != ["tsv.dev.tsv", "tsv.tsv"]:
        problems.append(f"submission files {subs}, expected tsv.dev.tsv and tsv.tsv")
    return result(
        "second evaluate / predict / plot / zeroshot refused (exit 2: pass "
        "--overwrite); predict --split dev writes tsv.dev.tsv beside the test file "
        "tsv.tsv",
        lost(before, work),
        problems,
    )


# ------------------------------------------------------------------ outputs onto inputs
def tree(folder: Path) -> dict[str, bytes | str | None]:
    """Every entry under `folder`, hidden ones and lock files included (file -> bytes, symlink
    -> its target, folder -> None): what a refused command must leave exactly as it was."""
    found: dict[str, bytes | str | None] = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root) / name
            key = str(path.relative_to(folder))
            if path.is_symlink():
                found[key] = os.readlink(path)
            elif path.is_file():
                found[key] = path.read_bytes()
            else:
                found[key] = None
    return found


def changed(before: dict[str, bytes | str | None], folder: Path) -> list[str]:
    """Entries added, removed or changed under `folder` since `tree` gave `before`."""
    after = tree(folder)
    return sorted(k for k in set(before) | set(after) if before.get(k, b"?") != after.get(k, b"?"))


def _flag(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with the value after `flag` replaced."""
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


def _corpus_dir(work: Path) -> Path:
    """A corpus folder read recursively: corpus/a.txt and corpus/sub/b.txt."""
    (work / "corpus" / "sub").mkdir(parents=True, exist_ok=True)
    (work / "corpus" / "a.txt").write_text("hello world. the cat sat on the mat.\n" * 20)
    (work / "corpus" / "sub" / "b.txt").write_text("a dog ran in the park.\n" * 20)
    return work / "corpus"


def _prepare_corpus(work: Path, out: Path) -> list[str]:
    """`gpt1 prepare` of `_corpus_dir(work)` with a character vocabulary into `out`."""
    vocab = char_vocab(work / "vocab")
    return ["prepare", "--corpus", str(_corpus_dir(work)), "--vocab", str(vocab), "--out", str(out)]


def _train_tokenizer(work: Path, out: Path) -> list[str]:
    """`gpt1 tokenizer train` (5 merges) on `_corpus_dir(work)` into `out`."""
    return [
        "tokenizer",
        "train",
        "--corpus",
        str(_corpus_dir(work)),
        "--merges",
        "5",
        "--out",
        str(out),
    ]


def _onto_its_weights(command: str, work: Path) -> list[str]:
    """`gpt1 COMMAND` (evaluate or predict) on a tiny fine-tuned run, writing its results over
    the run's own weights."""
    run, task = tiny_finetuned_run(work)
    out = run / "final" / "model.safetensors"
    return [command, str(run), "--data", str(task), "--out", str(out)]


def _onto_its_checkpoint(work: Path, command: list[str], *options: str) -> list[str]:
    """`gpt1 COMMAND CKPT OPTIONS` on a tiny checkpoint, writing over the checkpoint's weights."""
    ckpt = tiny_checkpoint(work / "ckpt")
    return [*command, str(ckpt), *options, "--out", str(ckpt / "model.safetensors")]


# Each builds its inputs under `work` and returns a command whose output is, holds or lies inside
# one of its inputs (real paths: a symlink to an input counts as the input).
ONTO_INPUTS: dict[str, Callable[[Path], list[str]]] = {
    "pretrain --out DATA --overwrite": lambda w: tiny_pretrain(
        make_corpus(w / "dd"), w / "dd", 1, "--overwrite"
    ),
    "pretrain --out PARENT-OF-DATA --overwrite": lambda w: tiny_pretrain(
        make_corpus(w / "top" / "dd"), w / "top", 1, "--overwrite"
    ),
    "pretrain --out LINK-TO-DATA --overwrite": lambda w: (
        (w / "link").symlink_to(make_corpus(w / "dd")),
        tiny_pretrain(w / "dd", w / "link", 1, "--overwrite"),
    )[1],
    "pretrain --data 'TEXT/**/*.txt' --out TEXT/sub --overwrite (text read directly)": lambda w: [
        *tiny_pretrain(Path(_corpus_dir(w), "**", "*.txt"), w / "corpus" / "sub", 1),
        "--overwrite",
        "--tokenizer",
        str(char_vocab(w / "vocab")),
    ],
    "finetune --out INIT-RUN --overwrite": lambda w: _flag(
        tiny_finetune(make_task(w / "task"), char_vocab(w / "vocab"), w / "pre", 1, "--overwrite"),
        "--init",
        str(tiny_checkpoint(w / "pre" / "final").parent),
    ),
    "finetune --out DATA --overwrite": lambda w: tiny_finetune(
        make_task(w / "task"), char_vocab(w / "vocab"), w / "task", 1, "--overwrite"
    ),
    "convert SRC SRC/model.safetensors --overwrite": lambda w: [
        "convert",
        str(tiny_checkpoint(w / "src")),
        str(w / "src" / "model.safetensors"),
        "--from",
        "gpt1",
        "--overwrite",
    ],
    "prepare --out CORPUS/sub --overwrite": lambda w: [
        *_prepare_corpus(w, w / "corpus" / "sub"),
        "--overwrite",
    ],
    "tokenizer train --out CORPUS/sub --overwrite": lambda w: [
        *_train_tokenizer(w, w / "corpus" / "sub"),
        "--overwrite",
    ],
    "evaluate --out RUN/final/model.safetensors": lambda w: _onto_its_weights("evaluate", w),
    "predict --out RUN/final/model.safetensors": lambda w: _onto_its_weights("predict", w),
    "zeroshot --out CKPT/model.safetensors": lambda w: _onto_its_checkpoint(
        w, ["zeroshot"], "--task", "sst2", "--data", str(make_task(w / "task"))
    ),
    "analysis positions --out CKPT/model.safetensors": lambda w: _onto_its_checkpoint(
        w, ["analysis", "positions"]
    ),
    "plot RUN --metric loss --out RUN/metrics.jsonl --overwrite": lambda w: [
        "plot",
        str(_run_with_metrics(w / "run")),
        "--metric",
        "loss",
        "--out",
        str(w / "run" / "metrics.jsonl"),
        "--overwrite",
    ],
    "demo --out DATA": lambda w: [
        "demo",
        "--corpus",
        str(_corpus_dir(w)),
        "--task",
        "tsv",
        "--columns",
        "text=text,label=label",
        "--labels",
        "neg,pos",
        "--data",
        str(make_task(w / "task")),
        "--out",
        str(w / "task"),
    ],
}
if importlib.util.find_spec("lm_eval") is not None:  # the eval extra
    ONTO_INPUTS["lm-eval --output_path CKPT/model.safetensors"] = lambda w: [
        "lm-eval",
        "--model_args",
        f"checkpoint={tiny_checkpoint(w / 'ckpt')}",
        "--tasks",
        "gpt1_sst2",
        "--output_path",
        str(w / "ckpt" / "model.safetensors"),
    ]


def _run_with_metrics(run: Path) -> Path:
    """A run folder holding only a metrics.jsonl of five logged steps (what `gpt1 plot` reads)."""
    run.mkdir(parents=True, exist_ok=True)
    lines = [{"step": s, "loss": 6.0 - 0.1 * s, "lr": 1e-3} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def onto_an_input(work: Path, name: str) -> list[str]:
    """Problems with command `name` of `ONTO_INPUTS`: it must exit 2 with one line saying the
    output is an input, and leave every file and folder under `work` as it was."""
    return refused_leaving_work_as_it_was(work, ONTO_INPUTS[name], "an input of this command")


def refused_leaving_work_as_it_was(
    work: Path, build: Callable[[Path], list[str]], *must: str
) -> list[str]:
    """Problems with the command `build(work)` returns (after making its inputs under `work`):
    it must exit 2 with one line holding each of `must`, and change nothing under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    argv = build(work)
    before = tree(work)
    code, err = run_cli(argv)
    return one_line(code, err, *must) + [f"changed {entry}" for entry in changed(before, work)]


def every_case_refused(
    work: Path, names: Iterable[str], check: Callable[[Path, str], list[str]], summary: str
) -> CaseResult:
    """`check` run on each of `names`, each in its own folder: changed files are data lost."""
    problems: list[str] = []
    for i, name in enumerate(names):
        problems += [f"{name}: {p}" for p in check(work / f"c{i:02d}", name)]
    return result(
        summary,
        [p for p in problems if ": changed " in p],
        [p for p in problems if ": changed " not in p],
    )


def outputs_onto_inputs(work: Path) -> CaseResult:
    return every_case_refused(
        work,
        ONTO_INPUTS,
        onto_an_input,
        f"all {len(ONTO_INPUTS)} refused (exit 2, one line naming the input), even with "
        "--overwrite; nothing on disk changed (no lock file, no folder)",
    )


# ------------------------------------------------------------ refusals leave nothing behind
# Each builds its inputs and returns (command, folder it names as --out): a run refused or
# failing before its first write, which must leave that folder as it was (or absent).
LEAVES_NOTHING: dict[str, Callable[[Path], tuple[list[str], Path]]] = {
    "pretrain into a non-empty folder": lambda w: (
        (w / "used").mkdir(),
        (w / "used" / "notes.txt").write_text("mine\n"),
        (tiny_pretrain(make_corpus(w / "dd"), w / "used", 1), w / "used"),
    )[2],
    "pretrain on missing data, new --out (and parent)": lambda w: (
        tiny_pretrain(w / "no-data", w / "new" / "run", 1),
        w / "new",
    ),
    "pretrain on missing data, empty --out": lambda w: (
        (w / "empty").mkdir(),
        (tiny_pretrain(w / "no-data", w / "empty", 1), w / "empty"),
    )[1],
    "finetune --eval-split of a split with no labels, new --out": lambda w: (
        (make_task(w / "task") / "test.tsv").write_text("text\nsome words\n"),
        (
            tiny_finetune(
                w / "task", char_vocab(w / "vocab"), w / "new", 1, "--eval-split", "test"
            ),
            w / "new",
        ),
    )[1],
    "finetune on missing task data, new --out": lambda w: (
        tiny_finetune(w / "no-task", char_vocab(w / "vocab"), w / "new", 1),
        w / "new",
    ),
    "pretrain --resume auto with another --lr": lambda w: _resumed_with(
        w, tiny_pretrain, "--lr", "0.5"
    ),
    "finetune --resume auto with another --seed": lambda w: _resumed_with(
        w, _tiny_finetune_here, "--seed", "7"
    ),
}


def _tiny_finetune_here(work: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return tiny_finetune(make_task(work / "task"), char_vocab(work / "vocab"), out, steps, *extra)


def _resumed_with(work: Path, argv_for: Callable, *change: str) -> tuple[list[str], Path]:
    """A 2-step run in work/run, and the command resuming it to 3 steps with `change`."""
    run = work / "run"
    first = work / "dd" if argv_for is tiny_pretrain else work
    if argv_for is tiny_pretrain:
        make_corpus(first)
    code, err = run_cli(argv_for(first, run, 2))
    if code:
        raise RuntimeError(f"the first run failed: {err[-300:]}")
    return argv_for(first, run, 3, "--resume", "auto", *change), run


def refusal_leaves_nothing(work: Path, name: str) -> list[str]:
    """Problems with `LEAVES_NOTHING[name]`: it must exit 2 with one line, and the folder it
    names must be exactly as before (a new one not made, no lock file left anywhere)."""
    return refused_leaving_work_as_it_was(work, lambda w: LEAVES_NOTHING[name](w)[0])


def refusals_leave_nothing(work: Path) -> CaseResult:
    return every_case_refused(
        work,
        LEAVES_NOTHING,
        refusal_leaves_nothing,
        f"all {len(LEAVES_NOTHING)} refused (exit 2, one line); no folder made, no lock file "
        "left, run.json and checkpoints of a refused resume unchanged",
    )


# ------------------------------------------------------------------------------- resumes
def _first_run(work: Path, kind: str) -> tuple[Path, Callable[..., list[str]]]:
    """A finished 2-step tiny `pretrain` or `finetune` run under `work` (made once; callers
    copy it), and the function giving that command's argv for (out, steps, *extra)."""
    home = work / f"first-{kind}"
    if kind == "pretrain":
        data = make_corpus(home / "dd") if not (home / "dd").is_dir() else home / "dd"

        def argv(out: Path, steps: int, *extra: str) -> list[str]:
            return tiny_pretrain(data, out, steps, *extra)
    else:
        task = make_task(home / "task") if not (home / "task").is_dir() else home / "task"
        vocab = char_vocab(home / "vocab")

        def argv(out: Path, steps: int, *extra: str) -> list[str]:
            return tiny_finetune(task, vocab, out, steps, "--save-every", "1", *extra)

    if not (home / "run" / "final").is_dir():
        code, err = run_cli(argv(home / "run", 2))
        if code:
            raise RuntimeError(f"the first {kind} run failed: {err[-300:]}")
    return home / "run", argv


# name: (command, extra arguments of the resume, words the refusal must hold)
RESUME_REFUSED: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "pretrain --set model.n_layer=3": (
        "pretrain",
        ("--set", "model.n_layer=3"),
        ("model.n_layer", "has 2", "asks for 3"),
    ),
    "pretrain --lr 0.5": ("pretrain", ("--lr", "0.5"), ("train.lr", "0.001", "0.5")),
    "pretrain --batch-size 8": ("pretrain", ("--batch-size", "8"), ("train.batch_size", "4", "8")),
    "pretrain --seed 7": ("pretrain", ("--seed", "7"), ("train.seed", "1234", "7")),
    "pretrain --data OTHER": ("pretrain", ("--data", "OTHER"), ("other tokens", "other")),
    "finetune --task csv": ("finetune", ("--task", "csv"), ("finetune.task", "'tsv'", "'csv'")),
    "finetune --data OTHER": ("finetune", ("--data", "OTHER"), ("finetune.data", "other")),
    "finetune --lr 0.5": ("finetune", ("--lr", "0.5"), ("train.lr", "0.5")),
    "finetune --batch-size 2": ("finetune", ("--batch-size", "2"), ("train.batch_size", "2")),
    "finetune --seed 7": ("finetune", ("--seed", "7"), ("train.seed", "42", "7")),
    "finetune --labels pos,neg": ("finetune", ("--labels", "pos,neg"), ("labels",)),
}


def other_data(folder: Path, kind: str) -> Path:
    """The OTHER data of `RESUME_REFUSED`: for pretraining, a prepared folder of other tokens
    (the same tokens at another path resume: the folder moved), for fine-tuning another task
    folder."""
    return make_corpus(folder, seed=1) if kind == "pretrain" else make_task(folder)


def refused_resumes(command: str) -> list[str]:
    """The names in `RESUME_REFUSED` that resume a `command` (pretrain or finetune) run."""
    return [name for name, (kind, _, _) in RESUME_REFUSED.items() if kind == command]


def resume_refused(work: Path, name: str) -> list[str]:
    """Problems with resuming a finished run with `RESUME_REFUSED[name]`'s setting: it must be
    refused in one line naming the setting and both values, with the run folder unchanged."""
    kind, extra, must = RESUME_REFUSED[name]
    first, argv_for = _first_run(work, kind)
    run = work / name.replace(" ", "_").replace("/", "_")
    shutil.copytree(first, run)
    if "OTHER" in extra:
        other = work / "other"
        if not other.is_dir():
            other_data(other, kind)
        extra = tuple(str(other) if e == "OTHER" else e for e in extra)
    argv = argv_for(run, 3, "--resume", "auto")
    for flag, value in zip(extra[::2], extra[1::2]):
        argv = (
            _flag(argv, flag, value) if flag in argv and flag != "--set" else argv + [flag, value]
        )
    before = tree(run)
    code, err = run_cli(argv)
    return one_line(code, err, *must) + [f"changed {e}" for e in changed(before, run)]


def resume_on_another_vocabulary(work: Path) -> list[str]:
    """Pretraining resumed on its data folder re-prepared with another vocabulary: refused,
    naming the data's meta.json (not the checkpoint) and both sizes."""
    must = ("model.vocab_size", "300", "200", str(work / "dd" / "meta.json"))
    return _resume_on_remade_data(work, {"vocab": 300}, {"vocab": 200}, must)


def resume_on_other_tokens(work: Path) -> list[str]:
    """Pretraining resumed on its data folder prepared again from other text, with the same
    vocabulary, shards and token counts: refused, naming the folder; the run folder unchanged."""
    return _resume_on_remade_data(work, {}, {"seed": 1}, ("other tokens", str(work / "dd")))


def _resume_on_remade_data(
    work: Path, first: dict[str, int], again: dict[str, int], must: tuple[str, ...]
) -> list[str]:
    """A tiny pretraining run on `make_corpus(work / "dd", **first)`, the folder then made
    again with `again` and the run resumed: refused in one line holding each of `must`, with
    the run folder unchanged."""
    data = make_corpus(work / "dd", **first)
    run = work / "run"
    code, err = run_cli(tiny_pretrain(data, run, 2))
    if code:
        return [f"the first run failed: {err[-300:]}"]
    make_corpus(data, **again)
    before = tree(run)
    code, err = run_cli(tiny_pretrain(data, run, 3, "--resume", "auto"))
    return one_line(code, err, *must) + [f"changed {e}" for e in changed(before, run)]


def resume_past_its_length(work: Path) -> list[str]:
    """A resume asking for fewer updates than its checkpoint has made: refused, in the run's
    folder (unchanged) and into a new --out (not created). A finished run resumed again at its
    own length: nothing to do, exit 0, nothing changed."""
    first, argv_for = _first_run(work, "pretrain")
    run = work / "past-its-length"
    shutil.copytree(first, run)
    before = tree(run)
    code, err = run_cli(argv_for(run, 1, "--resume", str(run / "step-2")))
    problems = one_line(code, err, "at step 2", "train.max_steps")
    fresh = work / "fresh-out"
    code, err = run_cli(argv_for(fresh, 1, "--resume", str(run / "step-2")))
    problems += one_line(code, err, "at step 2")
    if fresh.exists():
        problems.append(f"the refused resume created {fresh}")
    problems += resume_of_a_finished_run(work, "pretrain")
    return problems + [f"changed {e}" for e in changed(before, run)]


def resume_of_a_finished_run(work: Path, kind: str) -> list[str]:
    """A finished `kind` run resumed again with its own length: exit 0, nothing changed (not
    its final model, run.json, metrics, plots or results)."""
    first, argv_for = _first_run(work, kind)
    run = work / f"finished-again-{kind}"
    shutil.copytree(first, run)
    before = tree(run)
    code, err = run_cli(argv_for(run, 2, "--resume", "auto"))
    problems = [f"exit {code}: {err[-300:]}"] if code else []
    return problems + [f"changed {e}" for e in changed(before, run)]


def resume_on_edited_examples(work: Path) -> list[str]:
    """Fine-tuning resumed after one row of its training file was edited (same path, same row
    count): refused, naming the file; the run folder unchanged."""
    task, vocab, run = make_task(work / "task"), char_vocab(work / "vocab"), work / "run"
    code, err = run_cli(tiny_finetune(task, vocab, run, 2, "--save-every", "1"))
    if code:
        return [f"the first run failed: {err[-300:]}"]
    rows = (task / "train.tsv").read_text().splitlines()
    rows[5] = "the film was fine but sad\t" + rows[5].split("\t")[1]
    (task / "train.tsv").write_text("\n".join(rows) + "\n")
    before = tree(run)
    code, err = run_cli(tiny_finetune(task, vocab, run, 3, "--save-every", "1", "--resume", "auto"))
    problems = one_line(code, err, "not those the run being resumed", str(task / "train.tsv"))
    return problems + [f"changed {e}" for e in changed(before, run)]


def resume_on_moved_data(work: Path) -> list[str]:
    """Pretraining resumed with its prepared folder moved (a copy at another path, as on another
    machine): accepted, since the checkpoint's digest of the tokens checks what is read; run.json
    records the move, and the weights are those of the resume at the original path."""
    first, argv_for = _first_run(work, "pretrain")
    data = Path(argv_for(work, 1)[argv_for(work, 1).index("--data") + 1])
    moved = work / "moved-data"
    if not moved.is_dir():
        shutil.copytree(data, moved)
    runs = {}
    for name, folder in (("here", data), ("moved", moved)):
        run = runs[name] = work / f"resumed-{name}"
        shutil.copytree(first, run)
        code, err = run_cli(_flag(argv_for(run, 3, "--resume", "auto"), "--data", str(folder)))
        if code:
            return [f"resumed on the {name} data: exit {code}: {err[-300:]}"]
    problems = []
    resumes = json.loads((runs["moved"] / "run.json").read_text())["resumes"]
    if resumes[-1]["changed"].get("data.path") != {"was": str(data), "now": str(moved)}:
        problems.append(f"run.json resumes lack the move: {resumes[-1]!r}")
    weights = [(runs[n] / "final" / "model.safetensors").read_bytes() for n in runs]
    if weights[0] != weights[1]:
        problems.append("the resume on the moved data trained other weights")
    return problems


def resume_accepts(work: Path, kind: str) -> list[str]:
    """A resume with more steps and other checkpoint and logging intervals runs, and run.json
    records the step it resumed from and what changed."""
    first, argv_for = _first_run(work, kind)
    run = work / f"accepted-{kind}"
    shutil.copytree(first, run)
    argv = argv_for(run, 4, "--resume", "auto", "--save-every", "2", "--eval-every", "3")
    code, err = run_cli(argv)
    if code:
        return [f"exit {code}: {err[-300:]}"]
    resumes = json.loads((run / "run.json").read_text()).get("resumes")
    want = {"train.max_steps": {"was": 2, "now": 4}, "train.save_every": {"was": 1, "now": 2}}
    if not resumes or resumes[-1]["step"] != 2:
        return [f"run.json resumes: {resumes!r}"]
    got = resumes[-1]["changed"]
    return [f"run.json resumes[-1].changed lacks {k}: {got}" for k in want if got.get(k) != want[k]]


def resumes_that_change_the_run(work: Path) -> CaseResult:
    problems: list[str] = []
    for name in RESUME_REFUSED:
        problems += [f"{name}: {p}" for p in resume_refused(work, name)]
    problems += [f"vocabulary: {p}" for p in resume_on_another_vocabulary(work / "vocab-case")]
    problems += [f"other tokens: {p}" for p in resume_on_other_tokens(work / "tokens-case")]
    problems += [f"moved data: {p}" for p in resume_on_moved_data(work)]
    problems += [f"edited examples: {p}" for p in resume_on_edited_examples(work / "edited")]
    problems += [f"past its length: {p}" for p in resume_past_its_length(work)]
    problems += [f"finetune finished: {p}" for p in resume_of_a_finished_run(work, "finetune")]
    for kind in ("pretrain", "finetune"):
        problems += [f"{kind} accepted: {p}" for p in resume_accepts(work, kind)]
    return result(
        f"{len(RESUME_REFUSED) + 5} refused (exit 2, one line naming the setting, the run's value "
        "and the requested one; a re-prepared vocabulary names the data's meta.json, other "
        "tokens the data folder, an edited fine-tuning row its file, a length below the "
        "checkpoint's step that step), run folder "
        "unchanged; a finished run resumed again changes nothing; the data folder moved, more "
        "steps and other intervals accepted and recorded in run.json `resumes`",
        [p for p in problems if ": changed " in p],
        [p for p in problems if ": changed " not in p],
    )


# ------------------------------------------------------------------------- interruptions
# Each builds its inputs and returns (command, output) for a command that writes its output
# through a temporary folder.
INTERRUPTED: dict[str, Callable[[Path], tuple[list[str], Path]]] = {
    "convert --to hf": lambda w: (
        ["convert", str(tiny_checkpoint(w / "src")), str(w / "hf"), "--from", "gpt1", "--to", "hf"],
        w / "hf",
    ),
    "convert": lambda w: (
        ["convert", str(tiny_checkpoint(w / "src")), str(w / "dst"), "--from", "gpt1"],
        w / "dst",
    ),
    "prepare": lambda w: (_prepare_corpus(w, w / "prepared"), w / "prepared"),
    "tokenizer train": lambda w: (_train_tokenizer(w, w / "tok"), w / "tok"),
}

# Runs `gpt1 ARGV` with a signal delivered while its temporary output folder is complete but
# not yet published (the first fsync of a `.NAME.tmp-PID` folder), the worst moment to stop.
# The child takes Ctrl-C as a foreground command does, even where it was started with SIGINT
# ignored (a shell's background job, `cmd &`, ignores it and passes that on).
_SIGNAL_MID_WRITE = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import gpt1.files as files
real = files.fsync_dir
def fsync_then_signal(path):
    if ".tmp-" in str(path):
        files.fsync_dir = real
        real(path)
        os.kill(os.getpid(), int(sys.argv[1]))
        time.sleep(5)
    return real(path)
files.fsync_dir = fsync_then_signal
from gpt1.cli import main
sys.exit(main(["--quiet", *sys.argv[2:]]))
"""


def interrupted_write(work: Path, name: str, signum: int) -> list[str]:
    """Problems with `INTERRUPTED[name]` stopped by `signum` mid-write: it must exit 128 +
    signum with one line, leaving no temporary and no output."""
    work.mkdir(parents=True, exist_ok=True)
    argv, out = INTERRUPTED[name](work)
    proc = subprocess.run(
        [sys.executable, "-c", _SIGNAL_MID_WRITE, str(signum), *argv],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    problems = []
    if proc.returncode != 128 + signum:
        problems.append(f"exit {proc.returncode}, expected {128 + signum}: {proc.stderr[-200:]}")
    elif len(proc.stderr.strip().splitlines()) != 1:
        problems.append(f"stderr not one line: {proc.stderr[-300:]!r}")
    problems += [f"left {t}" for t in leftovers(work)]
    if out.exists():
        problems.append(f"{out.name} was published although the command was stopped")
    return problems


def interrupted_writers(work: Path) -> CaseResult:
    problems: list[str] = []
    for i, name in enumerate(INTERRUPTED):
        for signum in (signal.SIGINT, signal.SIGTERM):
            folder = work / f"c{i}-{signum.name}"
            problems += [
                f"{name} {signum.name}: {p}" for p in interrupted_write(folder, name, signum)
            ]
    return result(
        "convert (gpt1 and --to hf), prepare and tokenizer train stopped by SIGINT and SIGTERM "
        "between writing and publishing their output: exit 130 / 143, one line, no temporary "
        "folder left, no output",
        [],
        problems,
    )


# ------------------------------------------------------------------------ concurrency
def _start(argv: list[str], cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        gpt1_process(*argv),
        env=subprocess_env(),
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_step(run: Path, proc: subprocess.Popen, step: int, timeout: float = 300) -> bool:
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        lines = (
            (run / "metrics.jsonl").read_text().splitlines()
            if (run / "metrics.jsonl").is_file()
            else []
        )
        if sum('"loss"' in line for line in lines) >= step:
            return True
        time.sleep(0.02)
    return False


def _duplicated_steps(run: Path) -> list[int]:
    steps = [
        json.loads(line)["step"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    return sorted({s for s in steps if steps.count(s) > 1})


def _first_writer(work: Path, steps: int) -> tuple[list[str], Path, subprocess.Popen, list]:
    """A resumable tiny pretraining of `steps` steps on work/run, started as a process and
    returned once it has logged 2 steps: (its gpt1 arguments, the run, the process, problems)."""
    run = work / "run"
    argv = tiny_pretrain(make_corpus(work / "data"), run, steps, "--log-every", "1")
    argv += ["--resume", "auto"]
    first = _start(argv)
    problems: list[str] = []
    if not _wait_for_step(run, first, 2):
        problems.append(f"the first run never logged a step: {first.communicate()[1][-300:]}")
    return argv, run, first, problems


def two_writers_one_run(work: Path) -> CaseResult:
    argv, run, first, problems = _first_writer(work, 40)
    second = subprocess.run(
        gpt1_process(*argv),
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    running = first.poll() is None
    first.wait(timeout=600)
    problems += one_line(
        second.returncode,
        second.stderr.strip(),
        "in use by another gpt1",
        f"pid {first.pid}",
        "gpt1 --quiet pretrain --preset tiny",
        "since 20",
    )
    if not running:
        problems.append("the first run had finished before the second started (not a race)")
    if first.returncode != 0:
        problems.append(f"the first run failed: {first.stderr.read()[-300:]}")
    first.stderr.close()
    dups = _duplicated_steps(run) if (run / "metrics.jsonl").is_file() else []
    count, damaged = verify_run(run)
    return result(
        "second writer refused (exit 2) naming the holder (pid, host, command, start); "
        "first finished",
        [f"duplicated step {s} in metrics.jsonl" for s in dups] + damaged,
        problems,
    )


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat_file.parent.name))
    return found


def two_torchrun_launches_one_run(work: Path) -> CaseResult:
    """Two `torchrun --nproc_per_node 2` launches (gloo, CPU) on one run folder."""
    data = make_corpus(work / "data")
    run = work / "run"
    extra = ("--save-every", "1000", "--log-every", "1", "--resume", "auto")
    extra += ("--batch-size", "4", "--micro-batch", "2")
    argv = gpt1_process(
        *tiny_pretrain(data, run, 1_000_000, *extra), launcher=TORCHRUN_TWO_PROCESSES
    )
    first = subprocess.Popen(
        argv,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    problems: list[str] = []
    try:
        if not _wait_for_step(run, first, 2):
            problems.append("the first launch never logged a step")
        t0 = time.perf_counter()
        second = subprocess.run(
            argv, env=subprocess_env(), capture_output=True, text=True, timeout=300
        )
        seconds = time.perf_counter() - t0
        ranks = child_pids(first.pid)
        lines = [l for l in second.stderr.splitlines() if "gpt1 pretrain: error:" in l]
        if second.returncode == 0:
            problems.append("the second launch exited 0")
        if len(lines) != 1 or not all(
            words in lines[0] for words in ("in use by another gpt1 process", "since 20")
        ):
            problems.append(f"no one-line refusal: {second.stderr[-300:]!r}")
        elif not any(f"(pid {pid} " in lines[0] for pid in ranks):
            problems.append(f"the refusal does not name a rank of the first launch: {lines[0]}")
        if first.poll() is not None:
            problems.append("the first launch died")
    finally:
        ranks = child_pids(first.pid)
        first.send_signal(signal.SIGTERM)  # torchrun passes it on to its ranks
        try:
            first.wait(timeout=60)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
        for pid in ranks:  # in sessions of their own: never leave them running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        first.stderr.close()
    dups = _duplicated_steps(run) if (run / "metrics.jsonl").is_file() else []
    return result(
        f"second launch refused: rank 0 prints the one line naming the holder (rank 0 "
        f"of the first launch), torchrun stops rank 1 and exits 1 after "
        f"{seconds:.1f} s, start-up included; first launch undisturbed",
        [f"duplicated step {s} in metrics.jsonl" for s in dups],
        problems,
    )


def sigkilled_lock_holder(work: Path) -> CaseResult:
    argv, run, first, problems = _first_writer(work, 6)
    first.send_signal(signal.SIGKILL)
    first.wait()
    first.stderr.close()
    code, err = run_cli(argv)
    if code != 0:
        problems.append(f"the next run did not proceed: exit {code}: {err[:300]}")
    count, damaged = verify_run(run)
    if not (run / "final").is_dir():
        problems.append("no final checkpoint")
    return result(
        "the kernel released the lock; the next run resumed and finished", damaged, problems
    )


# -------------------------------------------------------------------------- disk faults
_MOUNTS: dict[str, bool] = {}


def private_mounts() -> bool:
    """Whether `unshare -rm` may mount a private tmpfs here (then disk faults are real)."""
    if "ok" not in _MOUNTS:
        probe = Path(tempfile.mkdtemp(prefix="gpt1-mount-"))
        try:
            done = subprocess.run(
                [
                    "unshare",
                    "-rm",
                    "sh",
                    "-c",
                    f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(probe))}",
                ],
                capture_output=True,
                timeout=30,
            )
            _MOUNTS["ok"] = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _MOUNTS["ok"] = False
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    return _MOUNTS["ok"]


def run_state(run: Path) -> dict:
    """What a fault left of `run`: problems with its checkpoints, temporaries beside it (under
    its parent, the mount), and its step folders."""
    _, problems = verify_run(run) if run.is_dir() else (0, [])
    steps = sorted(p.name for p in run.glob("step-*")) if run.is_dir() else []
    return {"problems": problems, "leftovers": leftovers(run.parent), "steps": steps}


# `run_state` printed as JSON from inside a mount namespace (the mount vanishes with it).
_INSPECT = """
import json, sys
from pathlib import Path
from helpers.fault_cases import run_state
print(json.dumps(run_state(Path(sys.argv[1]))))
"""


def _in_tmpfs(mount: Path, options: str, script: str) -> subprocess.CompletedProcess:
    """Run shell `script` in a private mount namespace where `mount` is a tmpfs (`options`);
    the mount and everything on it vanish when the script ends."""
    mount.mkdir(parents=True, exist_ok=True)
    sh = f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(mount))} && {script}"
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", sh],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _gpt1(argv: list[str]) -> str:
    return shlex.join(gpt1_process(*argv))


def _inspect(run: Path) -> str:
    return shlex.join([sys.executable, "-c", _INSPECT, str(run)])


def _checkpoints_survived(
    summary: str, code: int, err: str, state: dict, must: tuple[str, ...], problems=()
) -> CaseResult:
    """A run stopped by a disk fault: refused in one line holding each of `must`, no temporary
    left and every checkpoint intact (`state`: `run_state` after the fault)."""
    problems = [*problems, *one_line(code, err, *must)]
    problems += [f"leftover {p}" for p in state["leftovers"]]
    return result(summary, state["problems"], problems)


def _disk_full_outcome(code: int, err: str, state: dict, simulated: bool) -> CaseResult:
    none_before = ["no earlier checkpoint was written before the disk filled"] * (
        not state["steps"]
    )
    return _checkpoints_survived(
        "exit 2, one line naming the checkpoint, bytes needed and free; earlier checkpoints "
        "intact, no temporaries" + (" (simulated)" if simulated else " (real 4 MB tmpfs)"),
        code,
        err,
        state,
        ("No space left on device", "needs about", "is intact"),
        none_before,
    )


def disk_full_while_checkpointing(work: Path) -> CaseResult:
    data = make_corpus(work / "data")
    mount = work / "disk"
    run = mount / "run"
    argv = tiny_pretrain(data, run, 40, "--set", "train.keep_last=0")
    if private_mounts():
        done = _in_tmpfs(
            mount,
            "size=4m",
            f"{_gpt1(argv)} 2>{mount}/err; echo $? >{mount}/rc; "
            f"{_inspect(run)}; cat {mount}/rc; cat {mount}/err >&2",
        )
        lines = done.stdout.strip().splitlines()
        state, code = json.loads(lines[-2]), int(lines[-1])
        return _disk_full_outcome(code, done.stderr.strip(), state, simulated=False)
    from gpt1 import checkpoint_files as checkpoint

    real, calls = checkpoint.save_file, {"n": 0}

    def fills_up(tensors, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] > 4:  # step-1 and step-2 fit (weights + trainer state each)
            Path(filename).write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
        return real(tensors, filename, metadata=metadata)

    with mock.patch.object(checkpoint, "save_file", fills_up):
        code, err = run_cli(argv)
    state = run_state(run)
    return _disk_full_outcome(code, err, state, simulated=True)


def read_only_run_folder(work: Path) -> CaseResult:
    """A run resumed after its folder became read-only (a remount, a full quota)."""
    data = make_corpus(work / "data")
    mount = work / "ro"
    run = mount / "run"
    first = tiny_pretrain(data, run, 2)
    again = tiny_pretrain(data, run, 4, "--resume", "auto")
    if private_mounts():
        done = _in_tmpfs(
            mount,
            "size=16m",
            f"{_gpt1(first)} && mount -o remount,ro {mount} && "
            f"{{ {_gpt1(again)} 2>{work}/err; echo $? >{work}/rc; }}; {_inspect(run)}",
        )
        if done.returncode != 0 or not (work / "rc").is_file():
            return result("could not set up", [], [done.stderr[-300:]])
        state = json.loads(done.stdout.strip().splitlines()[-1])
        code, err, tag = int((work / "rc").read_text()), (work / "err").read_text().strip(), "real"
    else:
        code0, err0 = run_cli(first)
        from gpt1 import files

        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(run / LOCK_FILE))

        with mock.patch.object(files.os, "open", read_only):
            code, err = run_cli(again)
        state = run_state(run)
        tag = "simulated"
    return _checkpoints_survived(
        f"exit 2, one line naming the path; checkpoints intact ({tag} read-only mount)",
        code,
        err,
        state,
        ("Read-only file system", "needs a writable folder"),
    )


def disk_full_while_converting(work: Path) -> CaseResult:
    ckpt = tiny_checkpoint(work / "ckpt")
    mount = work / "disk"
    dst = mount / "out"
    argv = ["convert", str(ckpt), str(dst), "--from", "gpt1", "--to", "hf"]
    if private_mounts():
        done = _in_tmpfs(mount, "size=256k", f"{_gpt1(argv)}; echo $?; ls -A {mount}")
        lines = done.stdout.strip().splitlines()
        code, left, tag = int(lines[0]), lines[1:], "real 256 kB tmpfs"
        err = done.stderr.strip()
    else:
        from gpt1.recipes import convert

        def no_space(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        with mock.patch.object(convert, "save_file", no_space):
            code, err = run_cli(argv)
        left, tag = leftovers(work), "simulated"
    problems = one_line(code, err, str(dst), "No space left on device") + [
        f"leftover {n}" for n in left
    ]
    return result(
        f"exit 2, one line naming DST and the bytes needed; nothing left behind ({tag})",
        [],
        problems,
    )


_EXTRAS = {"convert": ("onnx", "onnxscript"), "lm-eval": ("lm_eval",)}  # for --to onnx, lm-eval


def _missing_extras(runs: list[list[str]]) -> set[str]:
    """The commands among `runs` whose optional packages are not installed here."""
    import importlib.util

    return {
        argv[0]
        for argv in runs
        if argv[0] in _EXTRAS and not all(importlib.util.find_spec(m) for m in _EXTRAS[argv[0]])
    }


def _not_run(missing: set[str]) -> str:
    return f" [NOT RUN here, extra not installed: {', '.join(sorted(missing))}]" if missing else ""


def read_only_export_and_results_folders(work: Path) -> CaseResult:
    """`convert --to onnx` and `lm-eval --output_path` aimed at a read-only folder: each must
    stop at once (before exporting or evaluating) with one line, and leave nothing there."""
    ckpt = tiny_checkpoint(work / "ckpt")
    mount = work / "ro"
    runs = [
        ["convert", str(ckpt), str(mount / "model.onnx"), "--from", "gpt1", "--to", "onnx"],
        ["lm-eval", "--model_args", f"checkpoint={ckpt}", "--tasks", "gpt1_sst2"]
        + ["--data", str(work), "--output_path", str(mount / "results")],
    ]
    missing = _missing_extras(runs)
    runs = [argv for argv in runs if argv[0] not in missing]
    if private_mounts():
        script = f"mount -o remount,ro {shlex.quote(str(mount))}"
        for i, argv in enumerate(runs):
            script += f"; {_gpt1(argv)} 2>{work}/err{i}; echo $? >{work}/rc{i}"
        done = _in_tmpfs(mount, "size=64k", script + f"; ls -A {shlex.quote(str(mount))}")
        if not (work / f"rc{len(runs) - 1}").is_file():
            return result("could not set up", [], [done.stderr[-300:]])
        outcomes = [
            (int((work / f"rc{i}").read_text()), (work / f"err{i}").read_text().strip())
            for i in range(len(runs))
        ]
        left, tag = done.stdout.split(), "real read-only mount"
    else:
        import pathlib

        from gpt1.recipes import harness

        def read_only(*args, **kwargs):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(mount))

        mount.mkdir()
        with (
            mock.patch.object(pathlib.Path, "write_bytes", read_only),
            mock.patch.object(harness.tempfile, "mkstemp", read_only),
        ):
            outcomes = [run_cli(argv) for argv in runs]
        left, tag = [p.name for p in mount.iterdir()], "simulated"
    problems = []
    for argv, (code, err) in zip(runs, outcomes):
        problems += [f"{argv[0]}: {p}" for p in one_line(code, err, "Read-only file system")]
    problems += [f"left {name}" for name in left]
    return result(
        f"convert --to onnx and lm-eval refused at once (exit 2, one line); nothing left ({tag})"
        + _not_run(missing),
        [],
        problems,
    )


# ------------------------------------------------------------------------------ umask
def files_follow_the_umask(work: Path) -> CaseResult:
    ckpt = tiny_checkpoint(work / "ckpt")
    problems: list[str] = []
    old = os.umask(0o027)
    try:
        code, err = run_cli(
            ["convert", str(ckpt), str(work / "hf"), "--from", "gpt1", "--to", "hf"]
        )
        code2, err2 = run_cli(["convert", str(work / "hf"), str(work / "back"), "--from", "hf"])
    finally:
        os.umask(old)
    problems += [e for c, e in ((code, err), (code2, err2)) if c]
    for folder in (work / "hf", work / "back"):
        for f in sorted(folder.iterdir()) if folder.is_dir() else []:
            mode = stat.S_IMODE(f.stat().st_mode)
            if mode != 0o640:
                problems.append(f"{f.name}: mode {mode:o}, expected 640 under umask 027")
    return result("weights, config and tokenizer files all 0640 under umask 027", [], problems)


# ------------------------------------------------------------------- sizes and types
# Time limits are checked when the table is printed (benchmarks/faults.py); tests turn them off,
# since a loaded test machine says nothing about speed.
CHECK_TIMES = True


def timed_cli(argv: list[str], cwd: Path | None = None) -> tuple[int, str, float]:
    """(exit status, stderr, seconds) of `gpt1 ARGV` in this process (start-up excluded)."""
    t0 = time.perf_counter()
    code, err = run_cli(argv, cwd)
    return code, err, time.perf_counter() - t0


def refused(
    runs: list[tuple[list[str], tuple[str, ...]]],
    outcome: str,
    limit: float | None = 1.0,
    watched: Path | None = None,
) -> CaseResult:
    """Each (argv, must) must exit 2 with one stderr line holding `must`, within `limit` seconds;
    nothing under `watched` may change (a refusal writes nothing)."""
    before = snapshot(watched) if watched is not None else {}
    problems, slowest = [], 0.0
    for argv, must in runs:
        code, err, seconds = timed_cli(argv)
        slowest = max(slowest, seconds)
        problems += [f"{argv[0]}: {p}" for p in one_line(code, err, *must)]
        if CHECK_TIMES and limit is not None and seconds > limit:
            problems.append(f"{argv[0]} took {seconds:.2f} s (limit {limit} s)")
    took = f"; slowest {slowest:.2f} s" if limit is not None else ""
    return result(outcome + took, lost(before, watched) if watched is not None else [], problems)


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _model_field(folder: Path, **fields) -> None:
    _edit_json(folder / "config.json", lambda d: d["model"].update(fields))


def billion_layers_in_a_checkpoint(work: Path) -> CaseResult:
    ckpt = tiny_checkpoint(work / "ckpt")
    _model_field(ckpt, n_layer=1_000_000_000)
    # Every field within its own range, but 10^15 parameters: refused by the memory estimate.
    huge = tiny_checkpoint(work / "huge")
    _model_field(huge, n_layer=4096, n_embd=2**17, n_head=2**10, n_inner=2**19)
    return refused(
        [
            (
                ["sample", str(ckpt), "--prompt", "x", "--max-new-tokens", "2"],
                ("config.json", "model.n_layer"),
            ),
            (
                ["sample", str(huge), "--prompt", "x", "--max-new-tokens", "2"],
                ("config.json", "n_layer=4,096", "needs at least"),
            ),
        ],
        "sample refused (exit 2) naming config.json and model.n_layer, nothing built; "
        "in-range fields adding up to 10^15 parameters refused by the memory estimate",
        watched=work,
    )


def mistyped_sizes_in_a_checkpoint(work: Path) -> CaseResult:
    runs = []
    for i, value in enumerate(["2", 2.5, True]):
        ckpt = tiny_checkpoint(work / f"ckpt{i}")
        _model_field(ckpt, n_layer=value)
        runs.append((["info", str(ckpt)], ("config.json", "model.n_layer must be", "an integer")))
    ckpt = tiny_checkpoint(work / "ckpt-version")
    _edit_json(ckpt / "config.json", lambda d: d.update(format_version="2"))
    runs.append((["info", str(ckpt)], ("config.json", "format_version")))
    return refused(
        runs,
        'info refused n_layer "2", 2.5 and true, and format_version "2" '
        "(exit 2, one line naming the field)",
    )


def billion_layers_in_an_hf_config(work: Path) -> CaseResult:
    from gpt1.model.gpt import GPT
    from gpt1.recipes.convert import save_hf

    hf = save_hf(GPT(ModelConfig(**ODD_SIZES_MODEL)), work / "hf")
    _edit_json(hf / "config.json", lambda d: d.update(n_layer=1_000_000_000))
    return refused(
        [
            (
                ["convert", str(hf), str(work / "out"), "--from", "hf"],
                ("config.json", "model.n_layer"),
            )
        ],
        "convert --from hf refused (exit 2) naming config.json and n_layer; no DST",
        watched=work,
    )


def openai_release(folder: Path) -> Path:
    """A tiny model saved the way OpenAI's release is: `params_shapes.json` + 10 .npy shards."""
    import numpy as np

    from gpt1.model.gpt import GPT
    from gpt1.recipes.convert import OPENAI_BLOCK

    config = ModelConfig(**ODD_SIZES_MODEL)
    sd = GPT(config).state_dict()
    arrays = [sd["wpe.weight"].numpy(), sd["wte.weight"].numpy()]
    for i in range(config.n_layer):
        for name, kind in OPENAI_BLOCK:
            t = sd[f"h.{i}.{name}"].numpy()
            arrays.append(t.T[None] if kind == "linear" else t)
    flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float32)
    folder.mkdir(parents=True)
    for i, part in enumerate(np.array_split(flat, 10)):
        np.save(folder / f"params_{i}.npy", part)
    (folder / "params_shapes.json").write_text(json.dumps([list(a.shape) for a in arrays]))
    return folder


def huge_params_shapes(work: Path) -> CaseResult:
    oai = openai_release(work / "oai")
    shapes = json.loads((oai / "params_shapes.json").read_text())
    (oai / "params_shapes.json").write_text(json.dumps(shapes[:2] + shapes[2:14] * 200_000))
    size = (oai / "params_shapes.json").stat().st_size
    return refused(
        [
            (
                ["convert", str(oai), str(work / "out"), "--from", "openai", "--n-head", "4"],
                ("params_shapes.json",),
            )
        ],
        f"convert --from openai refused a {size / 1e6:.0f} MB params_shapes.json "
        "(200,000 layers) by its size, naming the file",
        watched=work,
    )


def huge_n_outputs(work: Path) -> CaseResult:
    import torch
    from safetensors.torch import save_file

    from gpt1.checkpoint_files import HEAD_FILE, TASK_FILE

    runs = []
    for value in (20_000_000, 1e12):
        ft = tiny_checkpoint(work / f"ft-{value:g}")
        save_file(
            {"linear.weight": torch.zeros(2, 64), "linear.bias": torch.zeros(2)},
            str(ft / HEAD_FILE),
        )
        (ft / TASK_FILE).write_text(
            json.dumps(
                {
                    "task": "sst2",
                    "kind": "single",
                    "labels": None,
                    "n_outputs": value,
                    "n_ctx": 16,
                    "classify_id": 3,
                    "clf_pdrop": 0.1,
                    "question_delimiter": False,
                    "spec": None,
                }
            )
        )
        for command in ("evaluate", "predict"):
            runs.append(([command, str(ft), "--data", str(work)], ("task.json", "n_outputs")))
    return refused(
        runs,
        "evaluate and predict refused n_outputs 20,000,000 and 1e12 "
        "(exit 2, naming task.json and n_outputs), nothing allocated",
        watched=work,
    )


def nan_weights(work: Path) -> CaseResult:
    from safetensors.torch import load_file, save_file

    ckpt = tiny_checkpoint(work / "ckpt")
    state = load_file(str(ckpt / "model.safetensors"))
    state["h.1.mlp.c_fc.weight"][3, 4] = float("nan")
    save_file(state, str(ckpt / "model.safetensors"))
    sst2 = work / "sst2"
    sst2.mkdir()
    (sst2 / "dev.tsv").write_text("sentence\tlabel\na fine film\t1\na sad film\t0\n")
    must = ("h.1.mlp.c_fc.weight",)
    return refused(
        [
            (["convert", str(ckpt), str(work / "out"), "--from", "gpt1"], must),
            (
                [
                    "zeroshot",
                    str(ckpt),
                    "--task",
                    "sst2",
                    "--data",
                    str(sst2),
                    "--out",
                    str(work / "zs"),
                ],
                must,
            ),
            (["sample", str(ckpt), "--prompt", "x", "--max-new-tokens", "2"], must),
        ],
        "convert, zeroshot and sample refused (exit 2) naming the NaN tensor; no output written",
        limit=None,
        watched=work,
    )


def token_id_beyond_the_vocabulary(work: Path) -> CaseResult:
    import numpy as np

    from gpt1.text.shards import write_shard

    data = make_corpus(work / "data", vocab=300)
    ids = np.arange(3000) % 300
    ids[1234] = 300
    write_shard(data / "train-00001.bin", ids, 1, 400)
    return refused(
        [(tiny_pretrain(data, work / "run"), ("train-00001.bin", "token id 300"))],
        "pretrain refused at open (exit 2) naming the shard, id and position",
        limit=None,
        watched=data,
    )


def hf_index_outside_its_folder(work: Path) -> CaseResult:
    from safetensors.torch import load_file, save_file

    from gpt1.model.gpt import GPT
    from gpt1.recipes.convert import save_hf

    hf = save_hf(GPT(ModelConfig(**ODD_SIZES_MODEL)), work / "hf")
    state = load_file(str(hf / "model.safetensors"))
    names = sorted(state)
    save_file({k: state[k] for k in names[:5]}, str(hf / "part-1.safetensors"))
    save_file({k: state[k] for k in names[5:]}, str(work / "outside.safetensors"))
    (hf / "model.safetensors").unlink()
    (hf / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    k: "part-1.safetensors" if i < 5 else "../outside.safetensors"
                    for i, k in enumerate(names)
                }
            }
        )
    )
    return refused(
        [
            (
                ["convert", str(hf), str(work / "out"), "--from", "hf"],
                ("model.safetensors.index.json", "outside"),
            )
        ],
        "convert --from hf refused the `../outside.safetensors` entry (exit 2)",
        limit=None,
        watched=work,
    )


def options_out_of_range(work: Path) -> CaseResult:
    """Values a flag's type accepts but the command cannot use: each refused in one line before
    anything is loaded or run; extreme values that have a meaning (a temperature or top-p so
    small float32 cannot hold it) still sample."""
    ckpt = tiny_checkpoint(work / "ckpt")
    vocab = char_vocab(work / "vocab")
    sample = ["sample", str(ckpt), "--prompt-ids", "5 6", "--max-new-tokens", "2"]
    (work / "empty-data").mkdir(exist_ok=True)  # a folder: --data is checked to be one first
    lm_eval = ["lm-eval", "--tasks", "gpt1_sst2", "--data", str(work / "empty-data")]
    runs = [(sample + ["--temperature", t], ("--temperature", t)) for t in ("nan", "inf", "-1")]
    runs += [(sample + ["--top-p", p], ("--top-p", p)) for p in ("nan", "0", "1.5")]
    runs += [(sample + ["--seed", str(n)], ("--seed", str(n))) for n in (10**23, 2**64, -1)]
    runs += [
        (["tokenizer", "encode", "--vocab", str(vocab), "--processes", n], ("--processes", n))
        for n in ("0", "-3")
    ]
    runs += [
        (
            ["tokenizer", "train", "--corpus", str(work), "--merges", "2"]
            + ["--out", str(work / "tok"), "--processes", "0"],
            ("--processes",),
        ),
        (["lm-eval"], ("checkpoint=DIR is required",)),
        (lm_eval, ("checkpoint=DIR is required",)),
        (["lm-eval", "--model_args", f"checkpoint={ckpt}"], ("--tasks is required",)),
        (
            ["lm-eval", "--model_args", f"checkpoint={ckpt}", "--tasks", "gpt1_nosuch"],
            ("Tasks not found: gpt1_nosuch",),
        ),
    ]
    runs += [
        (
            lm_eval[:1] + ["--model_args", f"checkpoint={ckpt},max_length={n}"] + lm_eval[1:],
            ("max_length must be an integer 1..",),
        )
        for n in ("-5", "abc", "0", str(10**9))
    ]
    missing = _missing_extras([argv for argv, _ in runs])
    runs = [(argv, must) for argv, must in runs if argv[0] not in missing]
    outcome = refused(
        runs,
        "sample (NaN/inf/negative temperature, top-p outside (0, 1], seed outside 0..2^64-1), "
        "tokenizer --processes < 1, lm-eval (no checkpoint, no or unknown task, max_length "
        "outside the window): exit 2, one line; --temperature 1e-40 and --top-p 1e-50 sample",
        limit=None,
        watched=work,
    )
    problems = list(outcome.problems)
    for extreme in (["--temperature", "1e-40"], ["--top-p", "1e-50"]):
        code, err = run_cli(sample + extreme + ["--seed", "1"])
        if code != 0:
            problems.append(f"sample {' '.join(extreme)}: exit {code}: {err[-200:]}")
    text = outcome.outcome.split(" -- BUT ")[0] + _not_run(missing)
    return CaseResult(
        text if not problems else text + " -- BUT " + "; ".join(problems),
        outcome.data_lost,
        tuple(problems),
    )


# --------------------------------------------------------------------- text and readers
def a_run_of_punctuation(work: Path) -> CaseResult:
    """100,000 `!` on one line through `gpt1 tokenizer encode` (spaCy's suffix search alone is
    quadratic here); start-up (imports, loading spaCy) is measured on a one-character line and
    subtracted."""
    vocab = char_vocab(work / "vocab")
    argv = [sys.executable, "-m", "gpt1", "tokenizer", "encode", "--vocab", str(vocab)]

    def timed(text: str) -> tuple[float, subprocess.CompletedProcess]:
        t0 = time.perf_counter()
        done = subprocess.run(
            argv, input=text, env=subprocess_env(), capture_output=True, text=True, timeout=600
        )
        return time.perf_counter() - t0, done

    start, empty = timed("!\n")
    total, done = timed("!" * 100_000 + "\n")
    problems = [
        f"exit {c}: {d.stderr[-300:]}"
        for c, d in ((empty.returncode, empty), (done.returncode, done))
        if c
    ]
    n_ids = len(done.stdout.split())
    if not problems and n_ids < 1000:
        problems.append(f"only {n_ids} ids for 100,000 characters")
    work_s = total - start
    if CHECK_TIMES and work_s > 2.0:
        problems.append(f"{work_s:.2f} s beyond start-up (target 2 s)")
    return result(
        f"exit 0, {n_ids:,} ids in {work_s:.2f} s beyond start-up "
        f"({total:.2f} s in all; 1 `!` took {start:.2f} s)",
        [],
        problems,
    )


def _finetune_on(work: Path, fmt: str, text: str) -> list[str]:
    """`gpt1 finetune` on a generic `fmt` task whose train file is `text` (columns t and y)."""
    data = work / "data"
    data.mkdir(parents=True)
    (data / f"train.{fmt}").write_text(text)
    task = ("--task", fmt, "--columns", "text=t,label=y")
    vocab = char_vocab(work / "vocab")
    return tiny_finetune(data, vocab, work / "run", 1, "--batch-size", "2", task=task)


def strict_readers(work: Path) -> CaseResult:
    """Rows `gpt1 finetune` must refuse naming file, line and field, before any training."""
    big = "x" * 10_000_000
    good = {
        "csv": "id,t,y\n1,a fine film,pos\n2,a sad film,neg\n",
        "tsv": "id\tt\ty\n1\ta fine film\tpos\n2\ta sad film\tneg\n",
        "jsonl": '{"id": "1", "t": "a fine film", "y": "pos"}\n'
        '{"id": "2", "t": "a sad film", "y": "neg"}\n',
    }
    files = [  # (format, file text, what the one line must say)
        (
            "jsonl",
            good["jsonl"] + '{"id": "3", "t": "odd", "y": ["pos"]}\n',
            ("train.jsonl:3, field 'y'", "list"),
        ),
        (
            "jsonl",
            good["jsonl"] + '{"id": "3", "t": "odd", "y": "pos", "y": "neg"}\n',
            ("train.jsonl:3, field 'y'", "appears twice"),
        ),
        ("csv", "id,t,y,y\n1,a fine film,pos,pos\n", ("train.csv:1, field 'y'", "appears twice")),
        ("csv", good["csv"] + f"3,{big},pos\n", ("train.csv:4, field 't'", "limit")),
        ("tsv", good["tsv"] + f"3\t{big}\tpos\n", ("train.tsv:4, field 't'", "limit")),
        (
            "jsonl",
            good["jsonl"] + json.dumps({"id": "3", "t": big, "y": "pos"}) + "\n",
            ("train.jsonl:3, field 't'", "limit"),
        ),
    ]
    runs = [
        (_finetune_on(work / f"file-{i}", fmt, text), must)
        for i, (fmt, text, must) in enumerate(files)
    ]
    return refused(
        runs,
        "finetune refused a JSONL list label, a duplicated JSONL key, a "
        "duplicated CSV header name, and a 10 MB field in CSV, TSV and JSONL alike "
        "(exit 2, one line naming file, line and field)",
        limit=None,
    )


# meta.json edits that disagree with the shards: (edit, field named, shard named)
META_EDITS: dict[str, tuple[Callable[[dict], None], str, str]] = {
    "train tokens 5,999": (
        lambda d: d["splits"]["train"].update(tokens=5999),
        "splits.train.tokens",
        "train-00000.bin",
    ),
    "val documents 2": (
        lambda d: d["splits"]["val"].update(documents=2),
        "splits.val.documents",
        "val-00000.bin",
    ),
    "vocab_size 70,000 (uint16 shards)": (
        lambda d: d.update(vocab_size=70_000),
        "vocab_size",
        "train-00000.bin",
    ),
}


def meta_disagrees(work: Path) -> CaseResult:
    runs = []
    for i, (edit, field, shard) in enumerate(META_EDITS.values()):
        data = make_corpus(work / f"d{i}")
        _edit_json(data / "meta.json", edit)
        runs.append((tiny_pretrain(data, work / f"run{i}", 1), ("meta.json", field, shard)))
    return refused(
        runs,
        "pretrain refused a meta.json whose train tokens, val documents or vocab_size disagree "
        "with the shards (exit 2, one line naming meta.json, the field and the shard)",
        limit=None,
        watched=work,
    )


# ------------------------------------------------------------------------------- table
Case = Callable[[Path], CaseResult]


# ---------------------------------------------------------------------------------- serve
def serve_refuses_bad_options(work: Path) -> CaseResult:
    import torch

    ckpt = str(tiny_checkpoint(work / "ckpt"))
    runs: list[tuple[list[str], tuple[str, ...]]] = [
        (["serve", ckpt, "--device", "tpu"], ("device 'tpu'",)),
        (["serve", ckpt, "--threads", "-1"], ("--threads must be",)),
        (["serve", ckpt, "--request-timeout", "0"], ("--request-timeout",)),
        (["serve", ckpt, "--max-connections", "0"], ("--max-connections",)),
    ]
    if not torch.cuda.is_available():
        runs.append((["serve", ckpt, "--device", "cuda"], ("no CUDA device",)))
    return refused(
        runs,
        "serve refused --device tpu, --device cuda without a GPU, --threads -1, "
        "--request-timeout 0 and --max-connections 0 (exit 2, one line naming the option)",
        limit=None,  # the refusals come before the model loads; the imports dominate
        watched=work,
    )


def _http_status(port: int, request: bytes, timeout: float = 120) -> str:
    """The status code the server answers on a new connection that sends `request` (which
    may stop half-way), or what happened instead."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError as exc:
        return type(exc).__name__
    return answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/1.1 ") else "closed"


def _serve(ckpt: Path, port: int, log: Path, *options: str) -> subprocess.Popen:
    """`gpt1 serve` as a process, ready for requests (its log in `log`)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpt1", "serve", str(ckpt), "--port", str(port), *options],
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    end = time.time() + 300
    while (
        _http_status(
            port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 10
        )
        != "200"
    ):
        if proc.poll() is not None or time.time() > end:
            raise RuntimeError(f"gpt1 serve did not start: {log.read_text()[-300:]}")
        time.sleep(0.2)
    return proc


def half_sent_requests_flood(work: Path) -> CaseResult:
    """300 connections at once, each sending half a request's headers, against
    `gpt1 serve --request-timeout 1 --max-connections 100`."""
    import concurrent.futures
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = work / "serve.log"
    options = ["--request-timeout", "1", "--max-connections", "100", "--threads", "1"]
    proc = _serve(tiny_checkpoint(work / "ckpt"), port, log, *options)
    try:
        half = b"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"
        with concurrent.futures.ThreadPoolExecutor(300) as pool:
            answers = list(pool.map(lambda _: _http_status(port, half), range(300)))
        healthy = (
            _http_status(
                port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            == "200"
        )
    finally:
        proc.terminate()
        proc.wait(60)
    text = log.read_text()
    counts = {code: answers.count(code) for code in sorted(set(answers))}
    lines = [line for line in text.splitlines() if "connections" in line]
    problems = [f"answers {counts}"] * any(code not in ("408", "503") for code in counts)
    problems += ["the server did not answer /health afterwards"] * (not healthy)
    problems += [f"{text.count('Traceback')} tracebacks logged"] * ("Traceback" in text)
    problems += [f"{len(lines)} log lines about it"] * (len(lines) > 6)
    return result(
        f"{counts.get('408', 0)} answered 408 and closed after 1 s, {counts.get('503', 0)} past "
        f"the limit answered 503 at once; healthy afterwards; {len(lines)} counted log lines, "
        f"{text.count('Traceback')} tracebacks",
        [],
        problems,
    )


CASES: list[tuple[str, Case]] = [
    ("convert onto a folder of the user's files", convert_onto_a_users_folder),
    ("convert onto its own run folder, --overwrite", convert_over_its_own_run_with_overwrite),
    ("convert onto `.` / `..`", convert_onto_the_current_folder),
    ("pretrain into a folder with metrics/results/plots", pretrain_into_a_used_folder),
    ("evaluate / predict / plot / zeroshot onto their own earlier output", results_written_twice),
    ("two pretrain processes on one run folder", two_writers_one_run),
    ("two torchrun launches (2 ranks each) on one run folder", two_torchrun_launches_one_run),
    ("lock holder SIGKILLed, then --resume auto", sigkilled_lock_holder),
    ("disk full while writing a checkpoint", disk_full_while_checkpointing),
    ("run folder read-only on resume", read_only_run_folder),
    ("disk full while converting", disk_full_while_converting),
    (
        "convert --to onnx / lm-eval --output_path into a read-only folder",
        read_only_export_and_results_folders,
    ),
    ("umask 027", files_follow_the_umask),
    (
        "checkpoint config.json: n_layer 1e9 (or 10^15 parameters), then `sample`",
        billion_layers_in_a_checkpoint,
    ),
    (
        'config.json: n_layer "2" / 2.5 / true, format_version "2", then `info`',
        mistyped_sizes_in_a_checkpoint,
    ),
    ("HF config.json: n_layer 1e9, then `convert --from hf`", billion_layers_in_an_hf_config),
    ("params_shapes.json for 200,000 layers, then `convert --from openai`", huge_params_shapes),
    ("task.json: n_outputs 20,000,000 and 1e12, then `evaluate` / `predict`", huge_n_outputs),
    ("a NaN weight, then `convert` / `zeroshot` / `sample`", nan_weights),
    (
        "token id 300 in a shard of a 300-token vocabulary, then `pretrain`",
        token_id_beyond_the_vocabulary,
    ),
    ("HF index.json weight_map `../outside.safetensors`", hf_index_outside_its_folder),
    ("100,000 `!` through `tokenizer encode`", a_run_of_punctuation),
    (
        "out-of-range options: sample, tokenizer --processes, lm-eval model args and tasks",
        options_out_of_range,
    ),
    ("bad rows: JSONL list label, duplicate keys / header, 10 MB field", strict_readers),
    (
        "serve --device tpu / cuda (no GPU), --threads -1, --request-timeout 0",
        serve_refuses_bad_options,
    ),
    (
        "300 half-sent requests at once, serve --request-timeout 1 --max-connections 100",
        half_sent_requests_flood,
    ),
    (
        "every writing command with its output on one of its inputs (--overwrite, symlinks)",
        outputs_onto_inputs,
    ),
    ("a refused or failed run or resume: what it leaves behind", refusals_leave_nothing),
    ("--resume auto with other data, task, model, lr, batch or seed", resumes_that_change_the_run),
    ("SIGINT / SIGTERM while convert, prepare, tokenizer train publish", interrupted_writers),
    ("meta.json: tokens, documents or vocab_size not what the shards hold", meta_disagrees),
]


def run_cases(
    work: Path, cases: list[tuple[str, Case]] | None = None
) -> list[tuple[str, CaseResult]]:
    """Run each case in its own folder under `work`; an exception is a failed case, not a crash."""
    rows = []
    for i, (name, case) in enumerate(cases or CASES):
        folder = work / f"case-{i:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            rows.append((name, case(folder)))
        except Exception as exc:  # noqa: BLE001 - a crashing case is reported in its row
            rows.append(
                (
                    name,
                    CaseResult(
                        f"CRASHED: {type(exc).__name__}: {exc}"[:300],
                        0,
                        (f"{type(exc).__name__}: {exc}",),
                    ),
                )
            )
    return rows
