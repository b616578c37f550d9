"""Build gpt1's compiled decoding kernel for this CPU and environment now, or check the build
there (its checksum), and print its folder.

Decoding commands build it on first use (about a minute, once per machine and environment);
building it up front keeps that wait out of a first `gpt1 sample` or a test's timeout. A
damaged cached build is rebuilt. `gpt1 info --kernels` shows what each product runs on.

Examples:
  gpt1 kernels build
  GPT1_KERNEL_MARCH=x86-64-v3 gpt1 kernels build   # the AVX2+FMA build, beside the native one
"""

from __future__ import annotations

import argparse

HELP = "build (or check) gpt1's compiled decoding kernel for this CPU and print its folder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["build"], help="build: build or check the kernel")


def run(args: argparse.Namespace) -> int:
    from gpt1.recipes.info import build_kernels

    folder, fresh = build_kernels()
    print(f"{'built' if fresh else 'already built'}: {folder}")
    return 0
