"""Build gpt1's compiled decoding kernel for this CPU and environment now, or check the build
there (its checksum), and print its folder; or time torch's candidate products again.

Decoding commands build it on first use (2-5 minutes on 2 cores, once per machine and
environment, saying how long it has taken every 15 s); building it up front keeps that wait out
of a first `gpt1 sample` or a test's timeout. A damaged cached build is rebuilt.

`probe` times each product's paths again now (oneDNN's packed product against `F.linear`,
oneDNN's int8 product against the float path), prints both sides and records the choice, which
every later process on this machine takes. The backend re-times by itself where a record was
taken on a busy machine and it is quieter now, or torch changed; `probe` is for when you know
better (after a benchmark run finished, say). `gpt1 info --kernels` shows what each product
runs on.

Examples:
  gpt1 kernels build
  GPT1_KERNEL_MARCH=x86-64-v3 gpt1 kernels build   # the AVX2+FMA build, beside the native one
  gpt1 kernels probe
"""

from __future__ import annotations

import argparse

HELP = "build (or check) gpt1's compiled decoding kernel, or time the products again (probe)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        choices=["build", "probe"],
        help="build: build or check the kernel; probe: time each product's paths again and "
        "record the faster",
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "probe":
        return _probe()
    from gpt1.recipes.info import build_kernels

    folder, fresh = build_kernels()
    print(f"{'built' if fresh else 'already built'}: {folder}")
    return 0


def _probe() -> int:
    from gpt1.inference import backend, kernel_build, timings

    conditions, found = backend.probe_again()
    rounds = f"at least {timings.ROUNDS} interleaved rounds, {timings.BUDGET:g} s of them"
    print(f"timed at {conditions.describe()}; one thread, each path's best of {rounds}")
    print(f"recorded in {kernel_build.build_root()}")
    for timed in found:
        sides = ", ".join(f"{path} {_ms(seconds)}" for path, seconds in timed.times.items())
        print(f"  {timed.product}: {sides} -> {timed.chosen}")
    if not found:
        print("  nothing to time: this torch has no oneDNN products to choose between")
    if backend.onednn_has_int8():
        _probe_step()
    if conditions.busy:
        print(
            "the machine is busy: the next process times again once the load is lower "
            "(or run this again then)"
        )
    return 0


def _probe_step() -> None:
    """The int8 decoding step's check (`gpt1.inference.int8_step`): its times and threshold."""
    from gpt1.inference import int8_step

    step = int8_step.probe_again()
    for rows, old, new in zip(step.rows, step.one_call, step.integer):
        print(
            f"  int8 step of {rows} rows, one GPT-1 block + output layer: one call "
            f"{_ms(old[0])} + {_ms(old[1])}, integer {_ms(new[0])} + {_ms(new[1])}"
        )
    found = step.threshold(12)
    print(f"  -> 12 blocks: integer step {f'from {found} rows' if found else 'nowhere'}")


def _ms(seconds: float) -> str:
    return "failed" if seconds == float("inf") else f"{seconds * 1e3:.3g} ms"
