"""scripts/watch_silence.py: the check that `make demo` and `make test` never go quiet for long
(scripts/fresh_machine_check.sh runs both through it)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

SCRIPT = str(ROOT / "scripts" / "watch_silence.py")


def watch(limit: float, code: str) -> subprocess.CompletedProcess:
    command = [sys.executable, SCRIPT, "--limit", str(limit), "--", sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_command_that_keeps_talking_passes_and_its_output_goes_through():
    done = watch(5, "import time\nfor i in range(3): print(i, flush=True); time.sleep(0.2)")
    assert done.returncode == 0 and "0\n1\n2\n" in done.stdout
    assert "never silent for more than 5 s" in done.stdout


def test_a_long_silence_fails_and_says_after_what():
    done = watch(0.5, "import time\nprint('compiling', flush=True); time.sleep(1.5); print('ok')")
    assert done.returncode == 1
    assert "silent 1 s" in done.stdout or "silent 2 s" in done.stdout
    assert "after: compiling" in done.stdout


def test_the_command_status_wins():
    assert watch(5, "import sys; sys.exit(3)").returncode == 3


def test_a_heartbeat_speaks_for_a_quiet_command_and_keeps_its_status():
    command = [sys.executable, SCRIPT, "--heartbeat", "0.3", "--", sys.executable, "-c"]
    quiet = "import sys, time; time.sleep(1.2); sys.exit(4)"
    done = subprocess.run([*command, quiet], capture_output=True, text=True, timeout=60)
    assert done.returncode == 4
    assert done.stdout.count("still working") >= 2
