"""How fast one core streams int8 weights through a one-row product, against a plain read of the
same memory: the ceiling under which a batch-1 int8 decoding step works.

A decoding step's bound is its bytes over the memory's plain read rate (`inference.PlainReads`).
A product cannot read faster than the loop that consumes the bytes lets the core ask for them.
This builds `benchmarks/read_ceiling.cpp` with the system's C++ compiler (`-O3 -march=native`;
AVX-512 only) and times, alternating in one process on one thread, over weights on huge pages
far larger than the caches:

- **plain read**: fp32 numbers summed, the hardware's prefetchers only; and with each line fetched
  1 KB ahead into L2. The faster of the two is the 100% of the table.
- **int8 product, side by side, 32 KB ahead (gpt1)**: one row through row-major int8 weights as
  `gpt1/inference/kernels/matvec.cpp` reads them (four channels side by side, widened to fp32,
  the block's bytes fetched 32 KB ahead into L2); and the same loop with no fetching ahead.
- **int8 product, in reading order**: the same arithmetic with the weights stored in the order
  the loop reads them (one forward stream for the hardware's prefetchers; a layout gpt1 does not
  use, since its int8 weights are row-major and shared with the many-row products).
- **int8 integer dot, one channel at a time** (AVX-512 VNNI): the least arithmetic per byte,
  the weights not widened at all (`vpdpbusd` against a 24-bit fixed-point row in three byte
  planes); not gpt1's numerics, a bound on what less arithmetic could buy.

    python benchmarks/read_ceiling.py                 # K = 768 and 3072, 7 rounds
    python benchmarks/read_ceiling.py --k 768 --rounds 15 --mib 256
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "read_ceiling.cpp"


def build(folder: Path) -> Path:
    """The benchmark's executable, compiled into `folder`."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise SystemExit("read_ceiling: no C++ compiler (set CXX)")
    target = folder / "read_ceiling"
    done = subprocess.run(
        [compiler, "-O3", "-march=native", "-std=c++17", str(SOURCE), "-o", str(target)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["(no message)"])[0]
        raise SystemExit(f"read_ceiling: the build failed (it needs AVX-512): {first}")
    return target


def measure(program: Path, mib: int, k: int, rounds: int) -> dict[str, float]:
    """Each case's median rate in bytes/s, for weights of rows of `k` bytes."""
    done = subprocess.run(
        [str(program), str(mib), str(k), str(rounds)], capture_output=True, text=True, check=True
    )
    rates = {}
    for line in done.stdout.splitlines():
        name, rate = line.rsplit("\t", 1)
        rates[name] = float(rate)
    return rates


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--k", default="768,3072", help="row lengths (bytes of int8 weights)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--mib", type=int, default=512, help="MiB of the plain read (int8: a quarter)")
    args = p.parse_args()
    print(
        f"one thread, {time.strftime('%Y-%m-%d %H:%M')}, load average "
        f"{os.getloadavg()[0]:.1f}; medians of {args.rounds} rounds, cases alternating"
    )
    with tempfile.TemporaryDirectory() as folder:
        program = build(Path(folder))
        for k in (int(s) for s in args.k.split(",")):
            rates = measure(program, args.mib, k, args.rounds)
            plain = max(v for name, v in rates.items() if name.startswith("plain read"))
            print(f"\nrows of {k} weights{'':28s} GB/s   of the plain read")
            for name, rate in rates.items():
                print(f"{name:47s} {rate / 1e9:6.1f} {rate / plain:8.0%}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    sys.exit(main())
