"""The backend's speed checks taken on a busy machine, then again once it is quiet: a choice
made under load does not stay, and the one made quiet is the faster path.

1. In a temporary TORCH_EXTENSIONS_DIR (the user's records are left alone), `--load` busy-loop
   processes per CPU start; 30 s later, once the 1-minute load average says busy, the backend
   takes its checks as any process does (`float_probe`, `int8_probe`) and the record is
   printed: its load, each product's times and choice.
2. The busy loops stop. Once the load has fallen far enough for the record to be re-timed (to
   at most 3/4 of the recorded load, or quiet: `gpt1.inference.timings.stale`; at most
   `--settle` seconds), a fresh backend asks again, and the record it finds or takes is printed.
3. A reference: each check taken `--reference` more times now, each path's best over all of
   them; per product, the faster path against the one chosen in 2. A gap under 3% is a tie
   (either choice is right).

    python benchmarks/kernel_probe_load.py
    python benchmarks/kernel_probe_load.py --load 4 --settle 600
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

TIE = 0.03  # a gap between two paths' best times under which either choice is right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes per CPU")
    parser.add_argument("--settle", type=float, default=420, help="seconds to wait for quiet")
    parser.add_argument("--reference", type=int, default=4, help="checks in the reference")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="gpt1_probe_load_")
    os.environ["TORCH_EXTENSIONS_DIR"] = folder
    try:
        _run(args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(args: argparse.Namespace) -> None:
    from gpt1.inference import backend, timings

    cpus = os.cpu_count() or 1
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(args.load * cpus)
    ]
    try:
        time.sleep(30)  # the 1-minute load average then counts the busy loops
        _wait("busy", lambda load: load > timings.BUSY * cpus + 0.5 * len(spinners), 150)
        print(f"busy: {len(spinners)} busy-loop processes on {cpus} CPUs")
        _show(backend, timings)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    recorded = timings.read("float", backend.FloatProbe)[1]
    _wait("quieter", lambda _: timings.stale(recorded, timings.now()) is not None, args.settle)
    why = timings.stale(recorded, timings.now())
    print(f"quieter: the record is timed again because {why}" if why else "still busy")
    backend.reset()
    chosen = _show(backend, timings)
    print(f"reference: each path's best over {args.reference} more checks")
    for ref in _reference(backend, args.reference):
        ordered = sorted(ref.times.items(), key=lambda item: item[1])
        (fast, t_fast), (_, t_next) = ordered[0], ordered[1]
        tie = t_next <= t_fast * (1 + TIE)
        verdict = "right" if chosen[ref.product] == fast or tie else "WRONG"
        print(
            f"  {ref.product}: {_sides(ref)}; faster {fast}{' (a tie)' if tie else ''}; "
            f"chosen {chosen[ref.product]}: {verdict}"
        )


def _reference(backend, checks: int) -> list:
    """Each product's paths, each at its best over `checks` more checks taken now."""
    floats = [backend._measure_float() for _ in range(checks)]
    ints = [backend._measure_int8() for _ in range(checks)]
    best_floats = backend.FloatProbe(
        {
            name: {
                rows: [min(f.times[name][rows][i] for f in floats) for i in (0, 1)] for rows in by
            }
            for name, by in floats[0].times.items()
        }
    )
    best_ints = backend.Int8Probe(
        *(min(getattr(p, k) for p in ints) for k in ("float_path", "s8", "u8"))
    )
    return backend.timed(best_floats, best_ints)


def _wait(what: str, done, limit: float) -> None:
    start = time.monotonic()
    while not done(os.getloadavg()[0]) and time.monotonic() - start < limit:
        time.sleep(5)
    print(f"waited {time.monotonic() - start:.0f} s for {what}: load {os.getloadavg()[0]:.2f}")


def _show(backend, timings) -> dict[str, str]:
    """The checks as the backend takes them now (recorded, or timed again), printed."""
    found = backend.timed(backend.float_probe(), backend.int8_probe())
    print(f"  record: {timings.read('float', backend.FloatProbe)[1].describe()}")
    for row in found:
        print(f"  {row.product}: {_sides(row)} -> {row.chosen}")
    return {row.product: row.chosen for row in found}


def _sides(row) -> str:
    return ", ".join(f"{path} {seconds * 1e3:.3g} ms" for path, seconds in row.times.items())


if __name__ == "__main__":
    main()
