"""Sweep bookkeeping shared by the analyses: exact commands, completed sub-runs, resumption.

An analysis folder holds:
  commands.txt  every command line, appended as it starts: the analysis command itself (with a
                timestamp comment) and each sub-run's exact `gpt1 ...` command (shell-quoted), so
                any number in the results can be reproduced by pasting one line;
  sweep.json    {"analysis", "settings", "runs": {key: {"command", "result", "seconds"}}}:
                the sub-runs that finished, with their results. Written atomically after each one.
Re-running the same analysis into the same folder skips the finished sub-runs (a killed sweep
continues where it stopped; a sub-run killed half-way starts again from its beginning). Settings
that define the analysis (init checkpoint, task, data, ...) must match the recorded ones, since
mixing results from two set-ups in one table would be wrong; the set of sub-runs (seeds, K values,
sizes) may grow, and so may the settings an analysis names as `growable`: a growable mapping may
gain entries (a new task), a growable value recorded as null may be set once (a new row).
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpt1 import files
from gpt1.errors import ConfigError, DataError

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
COMMANDS_FILE = "commands.txt"


class Sweep:
    """The record of one analysis folder; `run(key, argv, fn)` executes a sub-run once."""

    def __init__(
        self,
        out: str | Path,
        analysis: str,
        settings: dict[str, Any],
        command: list[str] | None = None,
        growable: tuple[str, ...] = (),
    ):
        self.out = Path(out)
        self.growable = set(growable)
        if not (self.out / SWEEP_FILE).is_file() and not files.is_empty(self.out):
            # Only a folder this analysis started (its sweep.json) is continued.
            raise files.OutputExists(
                f"{self.out}: not empty and holds no {SWEEP_FILE} (not an "
                "analysis folder); choose another --out"
            )
        with files.writing(self.out):
            self.out.mkdir(parents=True, exist_ok=True)
        self.analysis = analysis
        self.settings = json.loads(
            json.dumps(settings)
        )  # normalise (tuples -> lists, Paths -> str)
        self.path = self.out / SWEEP_FILE
        self.runs: dict[str, dict[str, Any]] = {}
        self._load()
        self._write()
        self.log_command(command, comment=f"{time.strftime('%Y-%m-%d %H:%M:%S')} {analysis}")

    # ------------------------------------------------------------------ state
    def _load(self) -> None:
        if not self.path.is_file():
            return
        try:
            data = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(
                f"unreadable sweep record ({exc}); move it away to start afresh", self.path
            ) from None
        if data.get("analysis") != self.analysis:
            raise ConfigError(
                f"{self.path}: this folder holds a {data.get('analysis')!r} analysis, "
                f"not {self.analysis!r}; choose another --out"
            )
        old = data.get("settings", {})
        changed = sorted(
            k
            for k in set(old) | set(self.settings)
            if not self._compatible(k, old.get(k), self.settings.get(k))
        )
        if changed:
            diffs = "; ".join(
                f"{k}: recorded {old.get(k)!r}, now {self.settings.get(k)!r}" for k in changed
            )
            raise ConfigError(
                f"{self.path}: settings differ from the recorded sweep ({diffs}); "
                "use another --out or the recorded settings"
            )
        self.runs = dict(data.get("runs", {}))
        for key in self.growable & set(old):  # keep what earlier invocations recorded
            before, now = old[key], self.settings.get(key)
            if isinstance(before, dict) and isinstance(now, dict):
                self.settings[key] = {**before, **now}
            elif now is None:
                self.settings[key] = before

    def _compatible(self, key: str, before: Any, now: Any) -> bool:
        if before == now:
            return True
        if key not in self.growable:
            return False
        if isinstance(before, dict) and isinstance(now, dict):  # shared entries must agree
            return all(before[k] == now[k] for k in set(before) & set(now))
        return before is None or now is None

    def _write(self) -> None:
        data = {"analysis": self.analysis, "settings": self.settings, "runs": self.runs}
        files.write_text(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    def log_command(self, argv: list[str] | None, comment: str | None = None) -> None:
        """Append a command line (and an optional `# comment` line) to commands.txt."""
        record_command(self.out, argv, comment)

    # ------------------------------------------------------------------ runs
    def done(self, key: str) -> bool:
        return key in self.runs

    def result(self, key: str) -> dict[str, Any]:
        return self.runs[key]["result"]

    def done_with_prefix(self, prefix: str) -> list[str]:
        """Finished sub-run keys starting with `prefix`, sorted (e.g. every seed of a cell)."""
        return sorted(k for k in self.runs if k.startswith(prefix))

    def run(
        self,
        key: str,
        argv: list[str],
        fn: Callable[[], dict[str, Any]],
        run_dir: Path | None = None,
    ) -> dict[str, Any]:
        """The result of sub-run `key`: recorded if it finished before, else `fn()` now.

        `argv` is the exact command `fn` executes (recorded before it starts). A `run_dir` left by
        a killed attempt is removed first, so every recorded result comes from one clean run.
        """
        if key in self.runs:
            log.info("%s: %s already done, skipped", self.analysis, key)
            return self.runs[key]["result"]
        if run_dir is not None and Path(run_dir).exists():
            log.info("%s: removing the unfinished attempt in %s", self.analysis, run_dir)
            shutil.rmtree(run_dir)
        self.log_command(argv)
        log.info("%s: running %s", self.analysis, key)
        t0 = time.perf_counter()
        result = fn()
        self.runs[key] = {
            "command": shlex.join(argv),
            "result": result,
            "seconds": round(time.perf_counter() - t0, 2),
        }
        self._write()
        return result


def record_command(out: str | Path, argv: list[str] | None, comment: str | None = None) -> None:
    """Append a shell-quoted command line (after an optional `# comment`) to OUT/commands.txt."""
    if argv is None and comment is None:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / COMMANDS_FILE, "a") as fh:
        if comment:
            fh.write(f"# {comment}\n")
        if argv is not None:
            fh.write(shlex.join(argv) + "\n")
