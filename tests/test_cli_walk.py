"""Hostile flag values, refused by construction: every `gpt1` command, with each of its
value-taking flags (and positionals) set to a hostile value (0, -1, 10^9, 10^30, nan, inf, empty,
blank, non-ASCII, a folder where a file goes, a file where a folder goes, an unwritable place, a
full disk, a missing path) and its other arguments valid tiny inputs, ends with exit status 0 or
2, no traceback and no signal, within a time bound; a refusal (status 2) is one line on stderr
and changes nothing on disk.

The cases come from the parser itself (`gpt1.cli.build_parser`, walked into nested commands), so
a new flag is walked the day it lands; only each command's valid tiny command line (`BASELINES`)
is written here, and a command without one fails the walk.

How the cases run: in-process (`gpt1.cli.main`) in a worker subprocess (helpers.cli_walk), one
case after another, because a `python -m gpt1` per case costs 1-2 s of imports. The worker is
still a real process, so a signal (a segfault in native code) ends it and is seen, with
faulthandler's stack, and the case that was running is known; the worker is then restarted. A
case still running at its time bound is killed: allowed for the commands that serve or run a
whole pipeline (`LONG`) and for huge values (a count of 10^9 steps or tokens is work, not a
hang), a failure otherwise. What in-process running does not check: each command's process
start-up and exit (argv decoding, atexit); the subprocess tests elsewhere cover those.

`make test` runs a slice (`budget`), ordered so that every command comes first; `make fuzz`
(GPT1_FUZZ=full) at least 1,500 cases, covering every command and every value-taking flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import pytest

from gpt1.cli import build_parser
from helpers.fuzzing import FULL, budget, report
from helpers.tiny import (
    make_corpus,
    subprocess_env,
    tiny_checkpoint,
    tiny_finetune,
    tiny_finetuned_run,
    tiny_pretrain,
)

pytestmark = pytest.mark.fuzz

HUGE = ["1000000000", "1" + "0" * 30, "1e30", "inf"]
# {name} is a path in the worker's work folder (`make_inputs`)
VALUES = ["0", "-1", *HUGE, "nan", "", "  ", "ünïcødé ✓ 日本", "\udcff"]
VALUES += ["{task}", "{text}", "/sys/gpt1-walk/out", "{full}", "{work}/missing/x"]

# Commands that run until stopped (serve) or a whole pipeline (demo): still running at the time
# bound is fine for them whatever the value.
LONG = {"serve", "demo"}
SECONDS = {"serve": 8, "demo": 10, "lm-eval": 60}  # the time bound per case, else DEFAULT
DEFAULT_SECONDS = 30

SMALL_FT = ["--max-steps", "1", "--batch-size", "2", "--micro-batch", "2", "--n-ctx", "32"]
SWEEP = ["--init", "{ck}", "--out", "{out}", "--seeds", "0", *SMALL_FT]
# Each command's valid tiny command line: `{name}` is an input (`make_inputs`), `{out}` a path
# that does not exist yet (fresh for each case).
BASELINES: dict[str, list[str]] = {
    "demo": ["demo", "--out", "{out}", "--pretrain-steps", "2"],
    "info": ["info", "{ck}"],
    "kernels": ["kernels", "build"],
    "convert": ["convert", "{ck}", "{out}", "--from", "gpt1"],
    "sample": ["sample", "{ck}", "--prompt-ids", "1 2 3", "--max-new-tokens", "2"],
    "tokenizer encode": ["tokenizer", "encode", "--vocab", "{vocab}"],
    "tokenizer decode": ["tokenizer", "decode", "--vocab", "{vocab}"],
    "tokenizer train": ["tokenizer", "train", "--corpus", "{text}", "--merges", "5"]
    + ["--out", "{out}"],
    "prepare": ["prepare", "--corpus", "{text}", "--vocab", "{vocab}", "--out", "{out}"],
    # --max-steps 0 trains for the configured epochs: a hundredth of one here, not the preset's 100
    "pretrain": tiny_pretrain(Path("{corpus}"), Path("{out}"), 1, "--config", "{short}"),
    "plot": ["plot", "{run}", "--metric", "loss", "--out", "{out}.png"],
    "finetune": tiny_finetune(Path("{task}"), Path("{vocab}"), Path("{out}"), 1),
    "evaluate": ["evaluate", "{run}", "--data", "{task}", "--out", "{out}"],
    "predict": ["predict", "{run}", "--data", "{task}", "--out", "{out}"],
    "serve": ["serve", "{ck}", "--port", "0"],
    "zeroshot": ["zeroshot", "{ck}", "--task", "lambada", "--data", "{lambada}"]
    + ["--out", "{out}", "--limit", "2"],
    "lm-eval": ["lm-eval", "--model_args", "checkpoint={ck}", "--tasks", "gpt1_lambada"]
    + ["--data", "{lambada}", "--limit", "1"],
    "analysis positions": ["analysis", "positions", "{ck}", "--out", "{out}"],
    "analysis layers": ["analysis", "layers", "--task", "sst2", "--data", "{sst2}", "--ks", "0"]
    + SWEEP,
    "analysis ablations": ["analysis", "ablations", "--tasks", "sst2", "--data-root", "{root}"]
    + ["--task-data", "sst2=sst2", "--rows", "full", *SWEEP],
    "analysis data-size": ["analysis", "data-size", "--task", "sst2", "--data", "{sst2}"]
    + ["--sizes", "4", *SWEEP],
}
STDIN = {"tokenizer encode": "hello, world!\n", "tokenizer decode": "5 6 7\n"}


# -------------------------------------------------------------------------------- the cases
def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) for every command that runs, nested ones included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaf_commands(sub, (*path, name))


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action, (argparse._HelpAction, argparse._VersionAction)
    )


def with_value(
    parser: argparse.ArgumentParser, baseline: list[str], action: argparse.Action, value: str
) -> list[str]:
    """`baseline` with `action` set to `value` alone (replacing what the baseline gives it, and
    any flag of its mutually exclusive group)."""
    drop = {action}
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            drop.update(group._group_actions)
    flags = {s for a in drop for s in a.option_strings}
    argv, i = [], 0
    while i < len(baseline):
        if baseline[i] in flags:
            i += 1
            while i < len(baseline) and not baseline[i].startswith("--"):
                i += 1
            continue
        argv.append(baseline[i])
        i += 1
    if action.option_strings:
        return [*argv, f"{action.option_strings[0]}={value}"]
    # a positional: the baseline's token(s) for it
    known = parser.parse_known_args(argv[len(parser.prog.split()) - 1 :])[0]
    given = getattr(known, action.dest)
    given = given if isinstance(given, list) else [given]
    at = argv.index(given[0])
    return [*argv[:at], value, *argv[at + len(given) :]]


def all_cases() -> list[tuple[str, str, str, list[str]]]:
    """(command, flag, value, argv) for every value-taking flag of every command and every
    value, ordered so that any prefix is spread: the first cases touch every command, then
    every flag, each flag's values taken in a rotation of its own."""
    keyed = []
    for n_cmd, (path, parser) in enumerate(leaf_commands(build_parser())):
        command = " ".join(path)
        assert command in BASELINES, f"no valid tiny command line for `gpt1 {command}` here"
        actions = [a for a in parser._actions if takes_value(a)]
        for n_flag, action in enumerate(actions):
            name = action.option_strings[0] if action.option_strings else action.dest
            turn = zlib.crc32(f"{command} {name}".encode())
            for k in range(len(VALUES)):
                value = VALUES[(k + turn) % len(VALUES)]
                argv = with_value(parser, BASELINES[command], action, value)
                keyed.append(((k, n_flag, n_cmd), (command, name, value, argv)))
    return [case for _, case in sorted(keyed, key=lambda kc: kc[0])]


# --------------------------------------------------------------------------------- the disk
def make_inputs(folder: Path) -> None:
    """The valid tiny inputs every baseline names (built once, copied per worker)."""
    ck = tiny_checkpoint(folder / "ck")  # its vocabulary: folder / "vocab"
    make_corpus(folder / "corpus")
    tiny_finetuned_run(folder)  # folder / "ft", folder / "task"
    (folder / "text.txt").write_text("the cat sat on the mat.\n\nthe dog sat too.\n" * 20)
    (folder / "short.toml").write_text("[train]\nepochs = 0.01\n")
    (folder / "lambada").mkdir()
    (folder / "lambada" / "lambada.txt").write_text("the cat sat on the mat\n\nthe dog ran home\n")
    sst2 = folder / "root" / "sst2"
    sst2.mkdir(parents=True)
    for split, n in (("train", 8), ("dev", 4)):
        rows = [f"{'good fine film' if i % 2 else 'bad sad film'}\t{i % 2}" for i in range(n)]
        (sst2 / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    assert ck.is_dir()


def names(work: Path) -> dict[str, str]:
    inputs = work / "inputs"
    return {
        "work": str(work),
        "ck": str(inputs / "ck"),
        "vocab": str(inputs / "vocab"),
        "corpus": str(inputs / "corpus"),
        "run": str(inputs / "ft"),
        "task": str(inputs / "task"),
        "text": str(inputs / "text.txt"),
        "short": str(inputs / "short.toml"),
        "lambada": str(inputs / "lambada"),
        "root": str(inputs / "root"),
        "sst2": str(inputs / "root" / "sst2"),
        "full": str(work / "full"),  # a link to /dev/full: writes fail with ENOSPC
    }


def fill(token: str, paths: dict[str, str]) -> str:
    for key, value in paths.items():
        token = token.replace("{" + key + "}", value)
    return token


_hashes: dict[tuple, str] = {}


def snapshot(work: Path) -> dict[str, tuple]:
    """Every entry under `work` but the pristine inputs: its kind, and for a file its size,
    mtime and content hash (kept per (path, size, mtime, inode): a rewrite changes the mtime).
    Folders count by existence only (a temporary made and removed changes their mtime)."""
    found = {}
    for root, dirs, files in os.walk(work):
        dirs[:] = [d for d in dirs if Path(root, d) != work / "pristine"]
        for name in dirs + files:
            path = Path(root, name)
            st = path.lstat()
            if path.is_symlink() or not path.is_file():
                found[str(path)] = ("dir" if path.is_dir() else "other",)
                continue
            key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
            if key not in _hashes:
                _hashes[key] = hashlib.sha1(path.read_bytes()).hexdigest()
            found[str(path)] = ("file", st.st_size, st.st_mtime_ns, _hashes[key])
    return found


def reset(work: Path) -> None:
    """Back to the pristine inputs, an empty current folder and no outputs."""
    for name in ("inputs", "cwd", "out"):
        shutil.rmtree(work / name, ignore_errors=True)
    shutil.copytree(work / "pristine", work / "inputs", symlinks=True)
    (work / "cwd").mkdir()
    (work / "out").mkdir()


# ------------------------------------------------------------------------------- the worker
class Worker:
    """A helpers.cli_walk process and its work folder; restarted after a signal or a kill."""

    def __init__(self, work: Path) -> None:
        self.work, self.proc = work, None
        self.log = work.parent / f"{work.name}.stderr"

    def start(self) -> None:
        env = {**subprocess_env(), "MPLCONFIGDIR": str(self.work.parent / "mpl")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "helpers.cli_walk"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log, "ab"),
            env=env,
            text=True,
        )
        # A thread reads the protocol's lines: waiting on the pipe itself (select) missed a
        # result that arrived with its "started" line, read into the file's buffer together,
        # and a case refused in a millisecond showed as still running at its bound.
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(
            target=_read_lines, args=(self.proc.stdout, self.lines), daemon=True
        ).start()

    def run(self, argv: list[str], stdin: str, seconds: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        case = {"argv": argv, "stdin": stdin, "cwd": str(self.work / "cwd")}
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        started = self._line(60 + seconds)  # a fresh worker first imports gpt1
        result = started and self._line(seconds)
        if result:
            return json.loads(result)
        timed_out = self.proc.poll() is None
        self.stop()
        if timed_out:
            return {"code": "timeout", "stderr": ""}
        crash = self.log.read_text(errors="replace")[-2000:]
        return {"code": f"signal {-self.proc.returncode}", "stderr": crash}

    def _line(self, seconds: float) -> str | None:
        try:
            return self.lines.get(timeout=seconds)
        except queue.Empty:
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)  # the worker ended


def judge(command: str, value: str, result: dict, changed: list[str]) -> str | None:
    """What is wrong with a case's outcome, or None."""
    code, err = result["code"], result["stderr"]
    lines = [line for line in err.splitlines() if line.strip()]
    if code == "timeout":
        return None if command in LONG or value in HUGE else "still running at its time bound"
    if isinstance(code, str) and code.startswith("signal"):
        return f"killed by {code}: {err[-600:]}"
    if "Traceback" in err:
        return f"traceback: {err[-600:]}"
    if code not in (0, 2):
        return f"exit status {code}: {err[-300:]}"
    if code == 2 and len(lines) != 1:
        return f"refused in {len(lines)} lines: {err[-400:]}"
    if code == 2 and changed:
        return f"refused but changed {changed[:3]}"
    return None


def walk(cases, work: Path, found: list, counts: Counter) -> None:
    """Run `cases` one after another in one worker; add what is wrong to `found`."""
    worker = Worker(work)
    paths = names(work)
    try:
        for command, flag, value, argv in cases:
            paths["out"] = str(work / "out" / f"case{counts['runs']}")
            argv = [fill(token, {**paths, "out": paths["out"]}) for token in argv]
            before = snapshot(work)
            seconds = SECONDS.get(command.split()[0], DEFAULT_SECONDS)
            result = worker.run(argv, STDIN.get(command, ""), seconds)
            after = snapshot(work)
            changed = sorted(set(before.items()) ^ set(after.items()))
            changed = sorted({path for path, _ in changed})
            counts["runs"] += 1
            counts[_outcome(result["code"])] += 1
            problem = judge(command, value, result, changed)
            if problem:
                found.append(f"gpt1 {command} {flag}={value!r}: {problem}\n  argv: {argv}")
                counts["defects"] += 1
                counts["refusals_that_changed_disk"] += problem.startswith("refused but")
                counts["tracebacks"] += problem.startswith("traceback")
                counts["signals"] += problem.startswith("killed")
            if changed:
                reset(work)
    finally:
        worker.stop()


def _outcome(code) -> str:
    if code == 0:
        return "ok"
    if code == 2:
        return "refused"
    return "timeouts" if code == "timeout" else "other"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("walk") / "pristine"
    make_inputs(folder)
    return folder


def work_folder(inputs: Path, name: str) -> Path:
    work = inputs.parent / name
    shutil.copytree(inputs, work / "pristine", symlinks=True)
    (work / "full").symlink_to("/dev/full")
    reset(work)
    return work


def test_every_command_refuses_hostile_flag_values_by_construction(inputs):
    cases = all_cases()
    chosen = cases[: budget(60, 1600)]  # 1600: every flag of every command, 7 values each
    commands = {c for c, *_ in chosen}
    assert commands == set(BASELINES), "the slice leaves out a command"
    if FULL:  # every value-taking flag of every command
        assert {(c, f) for c, f, *_ in chosen} == {(c, f) for c, f, *_ in cases}
    # At most two workers, each with its own work folder (its snapshots are its own).
    n_workers = 2 if FULL else 1
    found: list[str] = []
    each = [Counter() for _ in range(n_workers)]
    started = time.monotonic()
    threads = [
        threading.Thread(
            target=walk, args=(chosen[i::n_workers], work_folder(inputs, f"w{i}"), found, each[i])
        )
        for i in range(n_workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = sum(each, Counter())
    report(
        "cli walk",
        runs=counts["runs"],
        commands=len(commands),
        flags=len({(c, f) for c, f, *_ in chosen}),
        ok=counts["ok"],
        refused=counts["refused"],
        still_running_at_bound=counts["timeouts"],
        tracebacks=counts["tracebacks"],
        signals=counts["signals"],
        refusals_that_changed_disk=counts["refusals_that_changed_disk"],
        defects=counts["defects"],
        seconds=int(time.monotonic() - started),
    )
    assert counts["runs"] == len(chosen)
    assert not found, f"{len(found)} defects:\n" + "\n".join(found[:40])
