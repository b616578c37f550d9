"""Fault cases: what a user's disk or a second process can do to a command, and what it costs.

Each case is a function `case(work: Path) -> CaseResult` that sets up its own files under `work`,
runs real `gpt1` commands (in this process through `gpt1.cli.main`, or as subprocesses where a
second process or a kill is the point), and reports the outcome in words and how many of the
user's files or checkpoints were lost or damaged. `CASES` lists them in table order; to add a case,
write a function and append it (`tests/test_faults.py` runs every case and asserts no data lost).

A full disk and a read-only folder are real where the machine lets an unprivileged process mount a
private tmpfs (`unshare -rm`, Linux user namespaces); elsewhere the writer is made to raise the
same OSError (ENOSPC, EROFS), and the outcome says "(simulated)".
"""
from __future__ import annotations

import contextlib
import errno
import io
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from unittest import mock

from gpt1.files import LOCK_FILE
from gpt1.testing.faults import char_vocab, env, make_corpus, make_task, verify_run


@dataclass
class CaseResult:
    """One row of the fault table."""

    outcome: str           # what the command did, in words (exit status and message)
    data_lost: int = 0     # user files or checkpoints deleted, replaced or damaged
    problems: tuple[str, ...] = ()   # what went wrong, when something did


# ------------------------------------------------------------------------------ helpers
def run_cli(argv: list[str], cwd: Path | None = None) -> tuple[int, str]:
    """(exit status, stderr) of `gpt1 ARGV` run in this process."""
    from gpt1.cli import main
    err = io.StringIO()
    old = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["--quiet", *argv])
    finally:
        os.chdir(old)
    return code, err.getvalue().strip()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative path -> bytes), the lock file excepted."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_FILE}


def lost(before: dict[str, bytes], folder: Path) -> list[str]:
    """Files of `before` that are gone or changed under `folder`."""
    after = snapshot(folder) if folder.is_dir() else {}
    return [name for name, data in before.items() if after.get(name) != data]


def leftovers(folder: Path) -> list[str]:
    """Temporary names (`.X.tmp-PID`, `.X.old-PID`, `.X.deleting-PID`) under `folder`."""
    return [str(p.relative_to(folder)) for p in folder.rglob(".*")
            if any(k in p.name for k in (".tmp-", ".old-", ".deleting-"))]


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
    return CaseResult(outcome if not problems else outcome + " -- BUT " + "; ".join(problems),
                      len(lost_files), tuple(problems + [f"lost {f}" for f in lost_files]))


def tiny_checkpoint(folder: Path) -> Path:
    """A tiny gpt1 checkpoint folder (random weights, character vocabulary)."""
    import torch
    from gpt1.model.checkpoint import save_model
    from gpt1.config import model_preset
    from gpt1.model.gpt import GPT
    torch.manual_seed(0)
    config = model_preset("tiny")
    config.vocab_size = 300
    return save_model(GPT(config), folder, char_vocab(folder.parent / "vocab"))


def tiny_pretrain(data: Path, out: Path, steps: int = 2, *extra: str) -> list[str]:
    return ["pretrain", "--preset", "tiny", "--data", str(data), "--out", str(out),
            "--max-steps", str(steps), "--save-every", "1", "--eval-every", "0",
            "--set", "train.peak_flops=1", *extra]


# --------------------------------------------------------------------------- overwrites
def convert_onto_a_users_folder(work: Path) -> CaseResult:
    ckpt = tiny_checkpoint(work / "ckpt")
    dst = work / "v"
    (dst / "sub").mkdir(parents=True)
    (dst / "thesis.txt").write_text("precious\n")
    (dst / "sub" / "notes.txt").write_text("also precious\n")
    before = snapshot(dst)
    code, err = run_cli(["convert", str(ckpt), str(dst), "--from", "gpt1"])
    return result("refused (exit 2, one line: pass --overwrite)", lost(before, dst),
                  one_line(code, err, str(dst), "--overwrite") + leftovers(work))


def convert_over_its_own_run_with_overwrite(work: Path) -> CaseResult:
    run = work / "rc"
    tiny_checkpoint(run / "final")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    before = snapshot(run)
    code, err = run_cli(["convert", str(run / "final"), str(run), "--from", "gpt1", "--overwrite"])
    return result("refused even with --overwrite (DST holds SRC)", lost(before, run),
                  one_line(code, err, "holds the source") + leftovers(work))


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
    return result("`.` and `..` refused, with and without --overwrite; no `..tmp-PID`",
                  lost(before, work / "here"), problems + leftovers(work))


def pretrain_into_a_used_folder(work: Path) -> CaseResult:
    data = make_corpus(work / "data")
    out = work / "run"
    out.mkdir()
    for name, text in (("metrics.jsonl", '{"step": 7, "loss": 3.0}\n'), ("run.json", "{}\n"),
                       ("results.json", '{"accuracy": 0.9}\n'), ("loss.png", "png")):
        (out / name).write_text(text)
    before = snapshot(out)
    code, err = run_cli(tiny_pretrain(data, out))
    problems = one_line(code, err, "--resume auto", "--overwrite")
    return result("refused (exit 2): resume, --overwrite or a new --out", lost(before, out),
                  problems)


def results_written_twice(work: Path) -> CaseResult:
    """evaluate, predict (test, then dev), plot and zeroshot: a second write needs --overwrite."""
    task, vocab = make_task(work / "task"), char_vocab(work / "vocab")
    (task / "test.tsv").write_text((task / "dev.tsv").read_text())
    run = work / "ft"
    ft = ["finetune", "--task", "tsv", "--columns", "text=text,label=label", "--labels",
          "neg,pos", "--data", str(task), "--init", "none", "--preset", "tiny", "--vocab",
          str(vocab), "--out", str(run), "--max-steps", "2", "--batch-size", "4",
          "--micro-batch", "2", "--n-ctx", "32", "--set", "train.peak_flops=1"]
    code, err = run_cli(ft)
    problems = [f"finetune failed: {err[:300]}"] if code else []
    writes = {"evaluate": ["evaluate", str(run), "--data", str(task)],
              "predict test": ["predict", str(run), "--data", str(task)],
              "predict dev": ["predict", str(run), "--data", str(task), "--split", "dev"],
              "plot": ["plot", str(run)]}
    for name, argv in writes.items():
        code, err = run_cli(argv)
        if code:
            problems.append(f"first {name}: exit {code}: {err[:200]}")
    (work / "zs").mkdir()
    (work / "zs" / "results.json").write_text('{"mine": true}\n')
    writes["zeroshot"] = ["zeroshot", str(run / "final"), "--task", "sst2", "--data", str(task),
                          "--out", str(work / "zs")]
    before = snapshot(work)
    for name, argv in writes.items():
        code, err = run_cli(argv)
        problems += [f"second {name}: {p}" for p in one_line(code, err, "--overwrite")]
    subs = sorted(p.name for p in (run / "submission").glob("*.tsv"))
    if subs != ["tsv.dev.tsv", "tsv.tsv"]:
        problems.append(f"submission files {subs}, expected tsv.dev.tsv and tsv.tsv")
    return result("second evaluate / predict / plot / zeroshot refused (exit 2: pass "
                  "--overwrite); predict --split dev writes tsv.dev.tsv beside the test file "
                  "tsv.tsv", lost(before, work), problems)


# ------------------------------------------------------------------------ concurrency
def _start(argv: list[str], cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpt1", "--quiet", *argv], env=env(), cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_step(run: Path, proc: subprocess.Popen, step: int, timeout: float = 300) -> bool:
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").is_file() else []
        if sum('"loss"' in line for line in lines) >= step:
            return True
        time.sleep(0.02)
    return False


def _duplicated_steps(run: Path) -> list[int]:
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if '"loss"' in line]
    return sorted({s for s in steps if steps.count(s) > 1})


def two_writers_one_run(work: Path) -> CaseResult:
    data = make_corpus(work / "data")
    run = work / "run"
    argv = tiny_pretrain(data, run, 40, "--log-every", "1", "--resume", "auto")
    first = _start(argv)
    problems: list[str] = []
    if not _wait_for_step(run, first, 2):
        problems.append(f"the first run never logged a step: {first.communicate()[1][-300:]}")
    second = subprocess.run([sys.executable, "-m", "gpt1", "--quiet", *argv], env=env(),
                            capture_output=True, text=True, timeout=300)
    running = first.poll() is None
    first.wait(timeout=600)
    problems += one_line(second.returncode, second.stderr.strip(), "in use by another gpt1",
                         f"pid {first.pid}", "gpt1 --quiet pretrain --preset tiny", "since 20")
    if not running:
        problems.append("the first run had finished before the second started (not a race)")
    if first.returncode != 0:
        problems.append(f"the first run failed: {first.stderr.read()[-300:]}")
    first.stderr.close()
    dups = _duplicated_steps(run) if (run / "metrics.jsonl").is_file() else []
    count, damaged = verify_run(run)
    return result("second writer refused (exit 2) naming the holder (pid, host, command, start); "
                  "first finished", [f"duplicated step {s} in metrics.jsonl" for s in dups]
                  + damaged, problems)


def sigkilled_lock_holder(work: Path) -> CaseResult:
    data = make_corpus(work / "data")
    run = work / "run"
    argv = tiny_pretrain(data, run, 6, "--log-every", "1", "--resume", "auto")
    first = _start(argv)
    problems: list[str] = []
    if not _wait_for_step(run, first, 2):
        problems.append("the first run never logged a step")
    first.send_signal(signal.SIGKILL)
    first.wait()
    first.stderr.close()
    code, err = run_cli(argv)
    if code != 0:
        problems.append(f"the next run did not proceed: exit {code}: {err[:300]}")
    count, damaged = verify_run(run)
    if not (run / "final").is_dir():
        problems.append("no final checkpoint")
    return result("the kernel released the lock; the next run resumed and finished", damaged,
                  problems)


# -------------------------------------------------------------------------- disk faults
_MOUNTS: dict[str, bool] = {}


def private_mounts() -> bool:
    """Whether `unshare -rm` may mount a private tmpfs here (then disk faults are real)."""
    if "ok" not in _MOUNTS:
        probe = Path(tempfile.mkdtemp(prefix="gpt1-mount-"))
        try:
            done = subprocess.run(["unshare", "-rm", "sh", "-c",
                                   f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(probe))}"],
                                  capture_output=True, timeout=30)
            _MOUNTS["ok"] = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _MOUNTS["ok"] = False
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    return _MOUNTS["ok"]


_INSPECT = """
import json, sys
from pathlib import Path
from gpt1.testing.fault_cases import leftovers
from gpt1.testing.faults import verify_run
run = Path(sys.argv[1])
count, problems = verify_run(run) if run.is_dir() else (0, [])
print(json.dumps({"verified": count, "problems": problems, "leftovers": leftovers(run.parent),
                  "steps": sorted(p.name for p in run.glob("step-*")) if run.is_dir() else []}))
"""


def _in_tmpfs(mount: Path, options: str, script: str) -> subprocess.CompletedProcess:
    """Run shell `script` in a private mount namespace where `mount` is a tmpfs (`options`);
    the mount and everything on it vanish when the script ends."""
    mount.mkdir(parents=True, exist_ok=True)
    sh = f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(mount))} && {script}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", sh], env=env(), capture_output=True,
                          text=True, timeout=600)


def _gpt1(argv: list[str]) -> str:
    return shlex.join([sys.executable, "-m", "gpt1", "--quiet", *argv])


def _inspect(run: Path) -> str:
    return shlex.join([sys.executable, "-c", _INSPECT, str(run)])


def _disk_full_outcome(code: int, err: str, state: dict, simulated: bool) -> CaseResult:
    problems = one_line(code, err, "No space left on device", "needs about", "is intact")
    problems += [f"leftover {p}" for p in state["leftovers"]]
    if not state["steps"]:
        problems.append("no earlier checkpoint was written before the disk filled")
    tag = " (simulated)" if simulated else " (real 4 MB tmpfs)"
    return result("exit 2, one line naming the checkpoint, bytes needed and free; earlier "
                  "checkpoints intact, no temporaries" + tag, state["problems"], problems)


def disk_full_while_checkpointing(work: Path) -> CaseResult:
    data = make_corpus(work / "data")
    mount = work / "disk"
    run = mount / "run"
    argv = tiny_pretrain(data, run, 40, "--set", "train.keep_last=0")
    if private_mounts():
        done = _in_tmpfs(mount, "size=4m", f"{_gpt1(argv)} 2>{mount}/err; echo $? >{mount}/rc; "
                         f"{_inspect(run)}; cat {mount}/rc; cat {mount}/err >&2")
        lines = done.stdout.strip().splitlines()
        state, code = json.loads(lines[-2]), int(lines[-1])
        return _disk_full_outcome(code, done.stderr.strip(), state, simulated=False)
    from gpt1.model import checkpoint
    real, calls = checkpoint.save_file, {"n": 0}

    def fills_up(tensors, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] > 4:     # step-1 and step-2 fit (weights + trainer state each)
            Path(filename).write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
        return real(tensors, filename, metadata=metadata)

    with mock.patch.object(checkpoint, "save_file", fills_up):
        code, err = run_cli(argv)
    count, damaged = verify_run(run)
    state = {"problems": damaged, "leftovers": leftovers(mount),
             "steps": sorted(p.name for p in run.glob("step-*"))}
    return _disk_full_outcome(code, err, state, simulated=True)


def read_only_run_folder(work: Path) -> CaseResult:
    """A run resumed after its folder became read-only (a remount, a full quota)."""
    data = make_corpus(work / "data")
    mount = work / "ro"
    run = mount / "run"
    first = tiny_pretrain(data, run, 2)
    again = tiny_pretrain(data, run, 4, "--resume", "auto")
    if private_mounts():
        done = _in_tmpfs(mount, "size=16m", f"{_gpt1(first)} && mount -o remount,ro {mount} && "
                         f"{{ {_gpt1(again)} 2>{work}/err; echo $? >{work}/rc; }}; {_inspect(run)}")
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
        count, damaged = verify_run(run)
        state = {"problems": damaged, "leftovers": leftovers(mount),
                 "steps": sorted(p.name for p in run.glob("step-*"))}
        tag = "simulated"
    problems = one_line(code, err, "Read-only file system", "needs a writable folder")
    problems += [f"leftover {p}" for p in state["leftovers"]]
    return result(f"exit 2, one line naming the path; checkpoints intact ({tag} read-only mount)",
                  state["problems"], problems)


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
    problems = one_line(code, err, str(dst), "No space left on device") + [f"leftover {n}"
                                                                          for n in left]
    return result(f"exit 2, one line naming DST and the bytes needed; nothing left behind ({tag})",
                  [], problems)


# ------------------------------------------------------------------------------ umask
def files_follow_the_umask(work: Path) -> CaseResult:
    ckpt = tiny_checkpoint(work / "ckpt")
    problems: list[str] = []
    old = os.umask(0o027)
    try:
        code, err = run_cli(["convert", str(ckpt), str(work / "hf"), "--from", "gpt1", "--to", "hf"])
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


# ------------------------------------------------------------------------------- table
Case = Callable[[Path], CaseResult]
CASES: list[tuple[str, Case]] = [
    ("convert onto a folder of the user's files", convert_onto_a_users_folder),
    ("convert onto its own run folder, --overwrite", convert_over_its_own_run_with_overwrite),
    ("convert onto `.` / `..`", convert_onto_the_current_folder),
    ("pretrain into a folder with metrics/results/plots", pretrain_into_a_used_folder),
    ("evaluate / predict / plot / zeroshot onto their own earlier output", results_written_twice),
    ("two pretrain processes on one run folder", two_writers_one_run),
    ("lock holder SIGKILLed, then --resume auto", sigkilled_lock_holder),
    ("disk full while writing a checkpoint", disk_full_while_checkpointing),
    ("run folder read-only on resume", read_only_run_folder),
    ("disk full while converting", disk_full_while_converting),
    ("umask 027", files_follow_the_umask),
]


def run_cases(work: Path, cases: list[tuple[str, Case]] | None = None
              ) -> list[tuple[str, CaseResult]]:
    """Run each case in its own folder under `work`; an exception is a failed case, not a crash."""
    rows = []
    for i, (name, case) in enumerate(cases or CASES):
        folder = work / f"case-{i:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            rows.append((name, case(folder)))
        except Exception as exc:  # noqa: BLE001 - a crashing case is reported in its row
            rows.append((name, CaseResult(f"CRASHED: {type(exc).__name__}: {exc}"[:300], 0,
                                          (f"{type(exc).__name__}: {exc}",))))
    return rows
