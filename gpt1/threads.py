"""How many CPU threads torch uses: one policy and one flag, `--threads`, for every command.

torch's default is one thread per core, each spinning for a few milliseconds at every barrier
between operations. Alone on the machine that is the fastest choice; beside other CPU-bound jobs it
is the slowest by far: a thread that loses its core holds up the others, which burn their share
spinning while they wait for it. One thread has no barriers to wait at: on a shared 2-core machine
a small training run took 150 s with one thread and 781 s with torch's two
(benchmarks/threads.py; docs/results.md, "Threads beside other jobs").

So `auto` (the default) measures before it chooses: it counts the CPUs this process may use
(`os.sched_getaffinity`) that other jobs leave free, from the kernel's busy/idle counters over a
short window, and runs that many threads (at least one). Inference loops call `adapt()` between
steps, which re-measures every few seconds and follows the machine as other jobs come and go.
Training does not: it keeps the count it started with for the whole run, and a resumed run takes
the count recorded in its checkpoint (`pin_for_training`), so its results never depend on the
load and a resume goes on exactly as the uninterrupted run would have. A number
(`--threads 2`), the environment variable `GPT1_THREADS`, or OpenMP's `OMP_NUM_THREADS` fixes the
count instead (and with it the results' last bits: reductions split differently across counts).

A count above the CPUs this process may use is capped at them with one warning (`cap_to_cpus`, also
used for worker processes; for `--threads` held with the thread-count line): more only queue for the same CPUs. Only the CLI applies the policy
(`gpt1.cli.main`); a program importing gpt1 keeps torch's settings.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from dataclasses import dataclass

from gpt1.errors import ConfigError

log = logging.getLogger(__name__)

AUTO = "auto"
ENV_VAR = "GPT1_THREADS"
THREADS_HELP = (
    "CPU threads: auto (default, or $GPT1_THREADS when set: the CPUs this process may use that"
    " other jobs leave free, measured at the start (and every few seconds in inference loops)) or a number"
)
PROBE_SECONDS = 0.2  # long enough for 20 scheduler ticks per CPU, short beside any command
ADAPT_EVERY_SECONDS = 5.0
FREE_ENOUGH = 0.75  # a CPU counts as free when others leave at least this share of it idle


def parse_threads(text: str | int) -> str | int:
    """`auto` or a positive whole number; anything else is a ConfigError naming the value."""
    value = str(text).strip().lower()
    if value == AUTO:
        return AUTO
    # isascii: str.isdigit also accepts digits int() cannot read ("²")
    if value.isascii() and value.isdigit() and int(value) > 0:
        return int(value)
    raise ConfigError(f"--threads must be 'auto' or a positive whole number, got {text!r}")


def _threads_type(text: str) -> str | int:
    try:
        return parse_threads(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """The one `--threads` flag. Its value is applied by `gpt1.cli.main` before the command runs.
    A command with sub-commands (`analysis positions ...`) takes it after the sub-command, like
    its other flags."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for each in [p for action in subcommands for p in action.choices.values()] or [parser]:
        each.add_argument(
            "--threads", type=_threads_type, default=None, metavar="N|auto", help=THREADS_HELP
        )


def cap_to_cpus(count: int, what: str, held: bool = False) -> int:
    """`count` threads or processes, at most as many as the CPUs this process may use: more only
    queue for them, and each costs memory and a slot in the process table (`--threads 999999`
    once exhausted it for every other job on the machine). A capped count is one warning naming
    `what` (the flag or setting that asked for it); `held`, it waits with the thread-count line
    (`_announce`), so that a command refused before it starts still says only why."""
    cpus = len(usable_cpus())
    if count <= cpus:
        return count
    if (what, count) not in _capped:  # once: a pool opened per batch would repeat it
        _capped.add((what, count))
        warning = f"{what}: {count} capped at {cpus}, the CPUs this process may use"
        if held:
            _announce(warning, logging.WARNING)
        else:
            log.warning("%s", warning)
    return cpus


_capped: set[tuple[str, int]] = set()


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask, which containers and taskset set)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """CPUs' worth of time a cgroup v2 quota grants (rounded up; a container's `--cpus`), or None
    when there is no quota: more threads than that only queue for the quota."""
    try:
        with open(path, encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota == "max":
            return None
        return max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return None


@dataclass
class _Sample:
    """Kernel counters at one moment: ticks of the chosen CPUs (busy, all) and this process's CPU
    seconds, so that our own threads are not counted as someone else's load."""

    busy: int
    total: int
    own_seconds: float
    at: float


def _sample(cpus: list[int]) -> _Sample | None:
    """Busy and total ticks of `cpus` from /proc/stat; None where there is no /proc/stat."""
    wanted = {f"cpu{n}" for n in cpus}
    busy = total = 0
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            for line in stat:
                fields = line.split()
                if not fields or fields[0] not in wanted:
                    continue
                ticks = [
                    int(x) for x in fields[1:9]
                ]  # user nice system idle iowait irq softirq steal
                idle = ticks[3] + ticks[4]
                total += sum(ticks)
                busy += sum(ticks) - idle
    except (OSError, ValueError, IndexError):
        return None
    times = os.times()
    return _Sample(busy, total, times.user + times.system, time.monotonic())


def _free_between(before: _Sample, after: _Sample, n_cpus: int) -> float | None:
    """CPUs (a fraction) that jobs other than this process left idle between two samples."""
    ticks = after.total - before.total
    if ticks <= 0:
        return None
    tick_seconds = (after.at - before.at) * n_cpus / ticks
    own_ticks = (after.own_seconds - before.own_seconds) / tick_seconds if tick_seconds else 0.0
    others = max(0.0, (after.busy - before.busy) - own_ticks)
    return max(0.0, n_cpus * (1.0 - others / ticks))


def measure_free(
    cpus: list[int], seconds: float = PROBE_SECONDS
) -> tuple[float | None, _Sample | None]:
    """How many of `cpus` other jobs leave idle over the next `seconds` (None when unknown), and
    the last sample, from which `adapt()` measures next."""
    before = _sample(cpus)
    if before is None:
        return None, None
    time.sleep(seconds)
    after = _sample(cpus)
    return (None if after is None else _free_between(before, after, len(cpus))), after


def threads_for(free: float | None, n_cpus: int) -> int:
    """The thread count for `free` idle CPUs out of `n_cpus`: whole free CPUs, at least one; all
    of them when the load cannot be measured (torch's own choice)."""
    if free is None:
        return n_cpus
    return max(1, min(n_cpus, int(free + (1.0 - FREE_ENOUGH))))


def requested_threads(flag: str | int | None) -> str | int:
    """The flag's value, else $GPT1_THREADS, else a whole $OMP_NUM_THREADS (OpenMP's own
    setting, kept), else auto; a bad $GPT1_THREADS is a ConfigError."""
    if flag is not None:
        return flag
    env = os.environ.get(ENV_VAR, "").strip()
    if not env:
        omp = os.environ.get("OMP_NUM_THREADS", "").strip()
        return int(omp) if omp.isascii() and omp.isdigit() and int(omp) > 0 else AUTO
    try:
        return parse_threads(env)
    except ConfigError:
        raise ConfigError(
            f"${ENV_VAR} must be 'auto' or a positive whole number, got {env!r}"
        ) from None


class _Governor:
    """Follows the machine's load in `auto` mode: re-measures between a loop's steps."""

    def __init__(self) -> None:
        self.active = False
        self.cpus: list[int] = []
        self.last: _Sample | None = None

    def start(self, cpus: list[int], sample: _Sample | None) -> None:
        self.active, self.cpus, self.last = True, cpus, sample

    def stop(self) -> None:
        self.active, self.last = False, None

    def tick(self) -> int | None:
        """A new thread count when one is due and differs from the current one, else None."""
        if not self.active or self.last is None:
            return None
        if time.monotonic() - self.last.at < ADAPT_EVERY_SECONDS:
            return None
        now = _sample(self.cpus)
        if now is None:
            return None
        free = _free_between(self.last, now, len(self.cpus))
        self.last = now
        import torch

        wanted = threads_for(free, len(self.cpus))
        if wanted == torch.get_num_threads():
            return None
        torch.set_num_threads(wanted)
        log.debug("threads: %d (%.1f of %d CPUs free)", wanted, free or 0.0, len(self.cpus))
        return wanted


_governor = _Governor()


def apply_threads(flag: str | int | None = None) -> int:
    """Set torch's thread count for this process by the policy above, and return it. What it
    chose and why is one INFO line (`threads: 2 (auto: 2.0 of 2 CPUs free)`), logged just before
    the command's first status line, or at its end (`announce_now`); so is the warning of a
    count capped at the CPUs."""
    import torch

    _announcement.held = []  # a command refused earlier in this process left its lines unsaid
    requested = requested_threads(flag)
    cpus = usable_cpus()
    if requested != AUTO:
        _governor.stop()
        threads = cap_to_cpus(int(requested), _fixed_by(flag), held=True)
        torch.set_num_threads(threads)
        _announce(f"threads: {threads} ({_fixed_by(flag)})")
        return threads
    free, last = measure_free(cpus)
    quota = cpu_quota()
    threads = min(threads_for(free, len(cpus)), quota or len(cpus))
    torch.set_num_threads(threads)
    _governor.start(cpus, last)
    limit = f", CPU quota {quota}" if quota is not None and quota < len(cpus) else ""
    _announce(f"threads: {threads} (auto: {_fmt(free)} of {len(cpus)} CPUs free{limit})")
    return threads


class _Announcement(logging.Filter):
    """The thread-count line (and a capped count's warning), held until the command's first
    status line (a log record of level INFO or above) or its successful end (`announce_now`):
    a command refused before it starts keeps its one-line error."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[int, str]] = []  # (logging level, line), in order

    def filter(self, record: logging.LogRecord) -> bool:
        if self.held and record.levelno >= logging.INFO:
            announce_now()  # passes this filter (nothing held now), then `record` follows
        return True


_announcement = _Announcement()


def _announce(line: str, level: int = logging.INFO) -> None:
    _announcement.held.append((level, line))
    for handler in logging.getLogger().handlers:
        if _announcement not in handler.filters:
            handler.addFilter(_announcement)


def announce_now() -> None:
    """Log the held lines if no status line has shown them yet (at a command's end)."""
    held, _announcement.held = _announcement.held, []
    for level, line in held:
        log.log(level, "%s", line)


def _fixed_by(flag: str | int | None) -> str:
    """What fixed the count, as the user would look for it."""
    if flag is not None:
        return "--threads"
    return f"${ENV_VAR}" if os.environ.get(ENV_VAR, "").strip() else "$OMP_NUM_THREADS"


def pin_for_training(recorded: int | None = None) -> int:
    """Keep the thread count fixed from here on, and return it: training calls this first,
    because a count that follows the load would make the run's results depend on it
    (reductions split differently across counts, so gradients differ in their last bits). In
    `auto` mode a resumed run takes `recorded`, the count it was started with, so that it goes
    on exactly as the uninterrupted run would have; a count the user fixed is kept as it is."""
    import torch

    if _governor.active:
        _governor.stop()
        if recorded is not None and recorded >= 1:
            torch.set_num_threads(int(recorded))
            log.info("threads: %d (resumed: the count this run was started with)", recorded)
    return torch.get_num_threads()


def adapt() -> None:
    """Called between the steps of a long loop: in `auto` mode, follows the load every few
    seconds (one read of /proc/stat when due, nothing otherwise)."""
    _governor.tick()


def _fmt(free: float | None) -> str:
    return "unknown" if free is None else f"{free:.1f}"
