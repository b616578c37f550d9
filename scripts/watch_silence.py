#!/usr/bin/env python3
"""Run a command, pass its output through, and fail if it was ever silent for too long.

    python3 scripts/watch_silence.py --limit 15 -- make demo

A newcomer cannot tell a long step from a hang: every step of `make demo` and `make test` must
print something at least every `--limit` seconds (pip's progress, the kernel build's elapsed
time, pytest's progress and its heartbeat). Any byte counts as output. Prints the longest
silences and the line before each; exits with the command's status, or 1 when the command
succeeded but a silence passed the limit. Standard library only: it runs before `.venv` exists.

    python3 scripts/watch_silence.py --heartbeat 10 -- pip install ...

With `--heartbeat N` it speaks for a quiet command instead (the Makefile's pip steps: pip says
nothing while it unpacks and installs): a line with the elapsed time after each N quiet seconds,
and only the command's own status.
"""

from __future__ import annotations

import argparse
import os
import selectors
import subprocess
import sys
import time


def watch(argv: list[str], limit: float, heartbeat: float | None = None) -> int:
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    last, tail = time.monotonic(), b""
    silences: list[tuple[float, float, str]] = []  # (length, when, the line before it)
    while True:
        if not selector.select(timeout=min(1.0, heartbeat or 1.0)):
            if heartbeat is not None and time.monotonic() - last >= heartbeat:
                print(f"  ... still working: {time.monotonic() - started:.0f} s", flush=True)
                last = time.monotonic()
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)
        now = time.monotonic()
        if now - last > limit:
            before = tail.decode(errors="replace").strip().splitlines()[-1:] or [""]
            silences.append((now - last, last - started, before[0][-120:]))
        if not chunk:
            break
        last = now
        tail = (tail + chunk)[-400:]
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    status = proc.wait()
    if heartbeat is not None:
        return status
    total = time.monotonic() - started
    print(f"\n[watch_silence] {' '.join(argv)}: exit {status} in {total:.0f} s", flush=True)
    for length, when, before in sorted(silences, reverse=True)[:5]:
        print(f"[watch_silence] silent {length:.0f} s from {when:.0f} s, after: {before}")
    if not silences:
        print(f"[watch_silence] never silent for more than {limit:g} s")
    return status if status != 0 else (1 if silences else 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=15.0, help="seconds (default 15)")
    parser.add_argument(
        "--heartbeat", type=float, metavar="N", help="print a line after each N quiet seconds"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --")
    return watch(command, args.limit, args.heartbeat)


if __name__ == "__main__":
    sys.exit(main())
