"""Kernel timings that do not depend on the moment they were taken.

A speed check (`gpt1.inference.backend`'s int8 and float probes) times each candidate in
interleaved rounds and keeps each one's best round (`interleaved_best`): a burst of load slows
whatever runs during it, and the minimum over rounds is the time the work takes when nothing
interrupts it. Its times are recorded beside the kernel's builds, per CPU and torch, with the
machine's load and CPU count and the identity of the torch library that was timed
(`Conditions`), and timed again (`kept`) where the record

- is stale: another torch library (upgraded, or installed again: its version, size or
  modification time differ); or
- was taken on a busy machine (a 1-minute load average above `BUSY` per CPU) and the machine is
  now quiet, or at most `QUIETER` as loaded as it was then.

A check taken under load is so replaced by one taken quieter, and never by one taken busier: a
choice made while `make test` kept every core busy does not stay for good. `gpt1 kernels probe`
times again on demand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt1.inference import kernel_build

ROUNDS = 9  # interleaved rounds at the least; each candidate's best is kept
# Rounds go on until the timed calls add up to this many seconds: a product of 0.1 ms needs
# hundreds of rounds before one of them runs while no other process shares its core (or, on
# a CPU with two threads a core, the core's other thread), one of 10 ms a few.
BUDGET = 0.1
# Load per CPU above which a one-thread timing shares its core or the memory with other work
# often enough to rank two paths within a few tens of percent of each other wrongly.
BUSY = 0.5
QUIETER = 0.75  # a busy record is timed again once the load is at most this share of its own


def interleaved_best(
    candidates: dict[str, Callable[[], object]],
    rounds: int = ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
    budget: float = BUDGET,
) -> dict[str, float]:
    """Each candidate's shortest time over at least `rounds` rounds, and as many more as fit
    until the timed calls add up to `budget` seconds, after one untimed call of each (inf for
    one that raises RuntimeError). Every round times every candidate once, in an order that
    turns around each round (A B, B A, ...): a burst of load, or a cache warmed by the one
    before, then falls on each alike."""
    names = list(candidates)
    best = dict.fromkeys(names, float("inf"))
    alive = []
    for name in names:
        try:
            candidates[name]()
            alive.append(name)
        except RuntimeError:
            pass
    turn, spent = 0, 0.0
    while alive and (turn < rounds or spent < budget):
        for name in alive if turn % 2 == 0 else alive[::-1]:
            start = clock()
            candidates[name]()
            took = clock() - start
            best[name], spent = min(best[name], took), spent + took
        turn += 1
    return best


@dataclass(frozen=True)
class Conditions:
    """What a timing was taken under: the 1-minute load average and CPU count when it began,
    the torch library timed (`torch_build`) and when (seconds since the epoch)."""

    load: float
    cpus: int
    build: str
    at: float

    @property
    def busy(self) -> bool:
        return self.load > BUSY * self.cpus

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.at))
        busy = ", busy" if self.busy else ""
        return f"load {self.load:.2f} on {self.cpus} CPUs{busy}, {when}"


def now() -> Conditions:
    """The conditions a timing taken now runs under."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average here: taken as busy, timed again when it can be told
        load = float("inf")
    return Conditions(load, os.cpu_count() or 1, torch_build(), time.time())


def torch_build() -> str:
    """The torch library whose kernels (oneDNN's among them) are timed: version, file, size and
    modification time, so a torch installed again in the same place is another build."""
    lib = Path(torch.__file__).resolve().parent
    found = sorted((lib / "lib").glob("*torch_cpu.*")) or [lib / "__init__.py"]
    stat = found[0].stat()
    return f"torch {torch.__version__} {found[0]} {stat.st_size} {stat.st_mtime_ns}"


def stale(record: Conditions, current: Conditions) -> str | None:
    """Why a record taken under `record` is timed again under `current`, or None (kept)."""
    if record.build != current.build:
        return "torch's library changed since"
    if record.busy and (not current.busy or current.load <= QUIETER * record.load):
        return f"it was timed on a busy machine (load {record.load:.2f} on {record.cpus} CPUs)"
    return None


def record_path(name: str) -> Path:
    """Where the `name` check's record is kept: beside the kernel's builds, per CPU and torch."""
    return kernel_build.build_root() / f"gpt1_{name}_probe_{_key()}.json"


# The variables that cap the instructions of the libraries under torch's products.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def _key() -> str:
    """The CPU, torch, and the caps on the instructions oneDNN, MKL and torch may use: a capped
    process (a simulated older CPU) runs other kernels, so it keeps its own times."""
    caps = [os.environ.get(name, "") for name in ISA_CAPS]
    parts = [
        kernel_build.cpu_flags(),
        torch.__version__,
        str(Path(torch.__file__).resolve().parent),
    ]
    parts += caps
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def read(name: str, kind: type) -> tuple[object, Conditions] | None:
    """The `name` check's recorded times (as `kind`) and their conditions, or None (no record,
    unreadable, or written before records carried their conditions)."""
    try:
        found = json.loads(record_path(name).read_text())
        return kind(**found["times"]), Conditions(**found["conditions"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def kept(name: str, kind: type, measure: Callable[[], object], again: bool = False) -> object:
    """The `name` check's times: the record's, unless it is missing or `stale` (or `again`),
    else `measure()`d now and recorded whole (for a reader in another process); a read-only
    cache is left as it is, and the check measured again next time."""
    current = now()
    found = None if again else read(name, kind)
    if found is not None and stale(found[1], current) is None:
        return found[0]
    with kernel_build.telling(f"timing {name} products for this CPU", first=5.0):
        probe = measure()
    found = {"times": dataclasses.asdict(probe), "conditions": dataclasses.asdict(current)}
    _keep(record_path(name), found)
    return probe


def _keep(record: Path, found: dict) -> None:
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        private = record.with_name(f".{record.name}.{os.getpid()}")
        private.write_text(json.dumps(found))
        private.replace(record)
    except OSError:
        pass
