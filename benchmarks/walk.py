"""Walk a `gpt1` command: which gpt1 source files control passes through, and how often it climbs.

    python benchmarks/walk.py --tiny-run runs/walk --follow runs/walk -- \
        sample runs/walk --prompt the --max-new-tokens 2
    python benchmarks/walk.py --trace -- sample RUN --prompt-ids "1 2" --max-new-tokens 2

The command after `--` runs in this process (`gpt1.cli.main`) under `sys.setprofile`.
`--tiny-run RUN` first writes a tiny pretrained checkpoint as `RUN/final` (seed-0 weights, the
character vocabulary of `tests/helpers/tiny.py`) unless it exists, so the walk needs no data.

What is counted, and how:

- The walk covers one function and everything it calls: by default the subcommand's
  `run(args)` (`gpt1/cli/<command>.py`), not the parser or logging set-up around it;
  `--start FILE:FUNCTION` names another (`--start all`: all of `gpt1.cli.main`). Module bodies
  executed by an import (and everything they call) are left out: importing is not the
  command's work.
- `--follow PATH` follows an argument through the code: only calls of functions given PATH, or
  a path inside it, are seen (an argument itself, or a field of a dataclass argument, two
  levels deep: a `CheckpointFolder`, a `Loaded`); the others count as time in their caller.
  Without it every call is seen.
- Control is "in" a gpt1 file while the innermost seen gpt1 frame on the call stack belongs to
  it; time in torch, the standard library or other packages counts for the gpt1 file that
  called them. A **stay** is a maximal run of consecutive events in one file (calls within one
  file are merged into one stay).
- A stay is entered **down** (a call into the file) or **up** (a return to a file already on
  the call stack above). A **climb** is a stay entered up in which control then does more
  work (calls any seen function) before leaving it: the caller resumes and goes on, as opposed
  to the plain unwinding of returns. A **re-entry** is a call into a file already on the stack.
- For a pair of file patterns `A:B` (`fnmatch` on the path under gpt1/, e.g.
  `model/*:checkpoint_files.py`): **down** = transitions from a file of A into one of B by a
  call, **up** = climbs into A straight from B (a return from B followed by more work in A).
- **calls** of named functions (`--count`) count every call of a gpt1 function of that name
  inside the walk, seen or not.
- **reads** count each opening for reading (`open`, `io.open`, so `Path.read_text`) of a file
  of that name (`--read`, default config.json, task.json, run.json) during the command: a
  read is a parse (every gpt1 reader of these files parses what it reads).
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import fnmatch
import functools
import io
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PACKAGE = ROOT / "gpt1"
PAIRS = ("model/*:checkpoint_files.py", "recipes/*:model/*", "inference/*:model/*")
COUNT = (  # the loader's steps: gpt1/checkpoint_files.py, gpt1/model/checkpoint.py, ...
    "resolve_checkpoint_dir",
    "open_checkpoint",  # reads a folder once (parse_config: its config.json)
    "parse_config",
    "read_task_record",
    "resume_checkpoint",
    "model_config",
    "load_model",  # every architecture, through ARCHITECTURES
    "ensure_model_fits",  # the memory check (GPT; ensure_lstm_fits for the LSTM)
    "ensure_lstm_fits",
    "load_weights",
    "load_finetuned_model",
    "for_inference",
)
READS = ("config.json", "task.json", "run.json")


@dataclass
class Stay:
    file: str  # path under gpt1/
    entered: str  # "down" (a call), "up" (a return), "start"
    worked: bool = False  # control called anything while here


@dataclass
class Walk:
    """The profile hook's state: the call stack's gpt1 files and the stays so far."""

    start: tuple[str, str] | None  # (file, function) where the walk starts; None: at once
    counted: tuple[str, ...]
    follow: str | None = None  # an absolute path: only frames given it are seen
    stack: list[str | None] = field(default_factory=list)  # gpt1 file per frame, None unseen
    skipping: int = 0  # depth inside an import's module body
    depth0: int | None = None  # stack depth of the walked function's frame
    done: bool = False  # the walked function has returned
    stays: list[Stay] = field(default_factory=list)
    reentries: int = 0
    calls: Counter = field(default_factory=Counter)

    @property
    def walking(self) -> bool:
        return not self.done and self.depth0 is not None and len(self.stack) >= self.depth0

    def current(self) -> str | None:
        return next((f for f in reversed(self.stack) if f is not None), None)

    def hook(self, frame, event, arg) -> None:
        if event == "call":
            self.on_call(frame)
        elif event == "return":
            self.on_return()

    def on_call(self, frame) -> None:
        code = frame.f_code
        if self.skipping or code.co_name == "<module>":
            self.skipping += 1
            return
        file = gpt1_file(code.co_filename)
        if self.depth0 is None and not self.done:
            if self.start is None or (file, code.co_name) == self.start:
                self.depth0 = len(self.stack) + 1
        seen = self.follow is None or given_path(frame, self.follow)
        if self.walking or self.depth0 == len(self.stack) + 1:
            if seen and self.stays and self.current() is not None:
                self.stays[-1].worked = True
            if file is not None and code.co_name in self.counted:
                self.calls[code.co_name] += 1
            if seen and file is not None and file != self.current() and file in self.stack:
                self.reentries += 1
        self.stack.append(file if seen else None)
        self.moved("down")

    def on_return(self) -> None:
        if self.skipping:
            self.skipping -= 1
            return
        if not self.stack:
            return
        self.stack.pop()
        if not self.done and self.depth0 is not None and len(self.stack) < self.depth0:
            self.done = True  # the walked function returned: the walk ends
            return
        self.moved("up")

    def moved(self, how: str) -> None:
        here = self.current()
        if not self.walking or here is None:
            return
        if not self.stays:
            self.stays.append(Stay(here, "start"))
        elif self.stays[-1].file != here:
            self.stays.append(Stay(here, how))


@functools.cache
def gpt1_file(filename: str) -> str | None:
    """The path under gpt1/ of a source file of the package, else None."""
    try:
        return Path(filename).resolve().relative_to(PACKAGE).as_posix()
    except ValueError:
        return None


def given_path(frame, root: str) -> bool:
    """Whether the function called in `frame` was given `root` or a path inside it as an
    argument, itself or as a field of a dataclass argument (two levels deep)."""
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return any(names_path(frame.f_locals.get(name), root, 2) for name in names)


def names_path(value: object, root: str, depth: int) -> bool:
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if not isinstance(text, str) or len(text) > 4096:
            return False
        path = os.path.abspath(text)
        return path == root or path.startswith(root + os.sep)
    if depth and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(
            names_path(getattr(value, f.name, None), root, depth - 1)
            for f in dataclasses.fields(value)
        )
    return False


def climbs(stays: list[Stay]) -> list[int]:
    """Indexes of the stays that are climbs (entered up, then more work there)."""
    return [i for i, s in enumerate(stays) if s.entered == "up" and s.worked]


def pair_counts(stays: list[Stay], pair: str) -> tuple[int, int]:
    """(down, up) between the two patterns of `pair` ("A:B"): calls from A into B, and climbs
    into A straight from B."""
    a, b = pair.split(":")
    down = up = 0
    for before, after in zip(stays, stays[1:]):
        if fnmatch.fnmatch(before.file, a) and fnmatch.fnmatch(after.file, b):
            down += after.entered == "down"
        if fnmatch.fnmatch(before.file, b) and fnmatch.fnmatch(after.file, a):
            up += after.entered == "up" and after.worked
    return down, up


@contextlib.contextmanager
def counting_reads(names: tuple[str, ...], counter: Counter):
    """Count openings for reading of files with these names (builtins.open and io.open, which
    pathlib's read_text uses)."""
    real = builtins.open

    def counted_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).name in names and "r" in mode:
            counter[Path(file).name] += 1
        return real(file, mode, *args, **kwargs)

    builtins.open = io.open = counted_open
    try:
        yield
    finally:
        builtins.open = io.open = real


def make_tiny_run(run: Path) -> None:
    """A tiny pretrained checkpoint at RUN/final (tests/helpers/tiny.py) whose vocabulary is its
    tokenizer's (any sampled id decodes), unless it exists."""
    from gpt1.config import model_preset
    from helpers.tiny import CHAR_PIECES, tiny_checkpoint

    if not (run / "final" / "config.json").is_file():
        sizes = model_preset("tiny").derive(vocab_size=len(CHAR_PIECES)).to_dict()
        tiny_checkpoint(run / "final", sizes)


def walk(argv: list[str], start: str | None, follow: Path | None, counted, reads):
    """Run `gpt1 ARGV` in this process under the profile hook: (walk, reads, exit status)."""
    from gpt1.cli import main

    if start is None:  # the subcommand's run(args)
        command = next(a for a in argv if not a.startswith("-"))
        start = f"cli/{command.replace('-', '_')}.py:run"
    where = None if start == "all" else tuple(start.rsplit(":", 1))
    followed = os.path.abspath(follow) if follow is not None else None
    state, read = Walk(where, tuple(counted), followed), Counter()  # type: ignore[arg-type]
    with counting_reads(tuple(reads), read):
        sys.setprofile(state.hook)
        try:
            code = main(argv)
        finally:
            sys.setprofile(None)
    return state, read, code


def report(state: Walk, read: Counter, pairs: tuple[str, ...], trace: bool) -> None:
    stays = state.stays
    up = climbs(stays)
    if trace:
        for i, s in enumerate(stays):
            mark = "climb" if i in up else s.entered
            print(f"{i:4d}  {mark:6s} {s.file}")
    print(f"stays            {len(stays)}")
    print(f"distinct files   {len({s.file for s in stays})}")
    print(f"climbs           {len(up)}")
    print(f"re-entries       {state.reentries}")
    for pair in pairs:
        down, back = pair_counts(stays, pair)
        a, b = pair.split(":")
        print(f"{a} <-> {b}: down {down}, up {back}")
    for name in state.counted:
        print(f"calls {name:28s} {state.calls[name]}")
    for name in sorted(read):
        print(f"reads {name:28s} {read[name]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny-run", type=Path, help="write a tiny checkpoint as RUN/final first")
    p.add_argument("--pair", action="append", help=f"A:B file patterns (default {PAIRS})")
    p.add_argument("--count", action="append", help="function names to count (default COUNT)")
    p.add_argument("--read", action="append", help=f"file names to count reads of ({READS})")
    p.add_argument("--start", help="FILE:FUNCTION to walk (default cli/<command>.py:run; all)")
    p.add_argument("--follow", type=Path, help="see only functions given this path (module doc)")
    p.add_argument("--trace", action="store_true", help="print every stay")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the gpt1 arguments")
    args = p.parse_args()
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not argv:
        p.error("give the gpt1 command after --")
    if args.tiny_run:
        make_tiny_run(args.tiny_run)
    state, read, code = walk(argv, args.start, args.follow, args.count or COUNT, args.read or READS)
    print(f"gpt1 {' '.join(argv)}: exit status {code}")
    report(state, read, tuple(args.pair or PAIRS), args.trace)
    return code


if __name__ == "__main__":
    sys.exit(main())
