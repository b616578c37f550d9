"""Batch-1 greedy decoding of GPT-1 size on CPU tiers: every precision of gpt1 and CTranslate2
under instruction-set caps on this host, each configuration in a process of its own.

A tier is what a CPU without some of this host's instructions would run, simulated by capping
every library at once:

* host: nothing capped;
* avx512: AVX-512 with VNNI and BF16 but no AMX, as an AMD EPYC (Zen 4) has
  (`ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`, `MKL_ENABLE_INSTRUCTIONS=AVX512_E3`,
  `CT2_FORCE_CPU_ISA=AVX512`, gpt1's kernel built for `GPT1_KERNEL_MARCH=cooperlake`);
* avx2: a laptop's AVX2 + FMA (`ONEDNN_MAX_CPU_ISA=AVX2`, `MKL_ENABLE_INSTRUCTIONS=AVX2`,
  `ATEN_CPU_CAPABILITY=avx2`, `CT2_FORCE_CPU_ISA=AVX2`, gpt1's kernel built for
  `GPT1_KERNEL_MARCH=x86-64-v3`);
* no-kernel: gpt1 without its compiled kernel (`GPT1_MATVEC=torch`): oneDNN's packed and int8
  products where they are faster, torch's operators elsewhere; CTranslate2 is the host's (not
  run again);
* torch-ops: every gpt1 fast path switched off (`GPT1_MATVEC=torch GPT1_PREPACK=0
  GPT1_INT8_MATMUL=0`): torch's own operators, the floor the no-kernel tier may never fall
  below (its table ends with the no-kernel tier's rate over this one's, per precision).

Each (tier, system) runs `benchmarks/generate_alone.py --json` in a child process with the
tier's environment: 128 new tokens after 32 (random weights, the seed of
`benchmarks/inference.py`), the median of `--repeats` after one warm-up. The bound of each gpt1
precision is the memory read bandwidth (`inference.read_bandwidth`, measured in each gpt1
child right after its rate: on a shared host it drifts by 10-20% within minutes) over the bytes
its decoding step reads (`inference.decode_bytes`: the weights and the cache at the
generation's mean context); the share of it is given for the decoding steps (the time after the
first token) and for the whole generation, prompt included. The load
average is printed before and after each child: on a shared machine it says how much the figures
mean.

    python benchmarks/tiers.py                               # every tier, 3 repeats
    python benchmarks/tiers.py --tiers avx2 --repeats 1      # one tier, quickly
    python benchmarks/tiers.py --int8-float-products         # int8 prompts on the float path
    python benchmarks/tiers.py --threads 1                   # on a machine shared with others

`--int8-float-products` sets `GPT1_INT8_MATMUL=0` for gpt1's int8 runs: the prompt's many-row
products then run as bf16 products over the int8 values instead of oneDNN's int8 kernel (on CPUs
without AMX oneDNN may run its reference int8 kernel, far slower than either).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# MKL is capped as well as oneDNN: torch's fp32 products and CTranslate2's int8 products
# (its wheel links MKL statically) run on MKL, which `CT2_FORCE_CPU_ISA` and
# `ATEN_CPU_CAPABILITY` do not reach. Uncapped, CTranslate2's "AVX2" int8 ran on AMX here.
TIERS: dict[str, dict[str, str]] = {
    "host": {},
    "avx512": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512_E3",
        "CT2_FORCE_CPU_ISA": "AVX512",
        "GPT1_KERNEL_MARCH": "cooperlake",  # AVX-512 VNNI and BF16 without AMX, as Zen 4
    },
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "CT2_FORCE_CPU_ISA": "AVX2",
        "GPT1_KERNEL_MARCH": "x86-64-v3",
    },
    "no-kernel": {"GPT1_MATVEC": "torch"},
    "torch-ops": {"GPT1_MATVEC": "torch", "GPT1_PREPACK": "0", "GPT1_INT8_MATMUL": "0"},
}
GPT1 = ("gpt1:fp32", "gpt1:bf16", "gpt1:int8")
CT2 = ("ct2:float32", "ct2:int8")
# The CTranslate2 figures a tier is compared with: its own, or the host's where CT2 is not capped.
CT2_FROM = {
    "host": "host",
    "avx512": "avx512",
    "avx2": "avx2",
    "no-kernel": "host",
    "torch-ops": "host",
}


def enter_tier(tier: str) -> None:
    """Start this script again with `tier`'s caps in its environment, unless they are there (the
    libraries read them when they load, before any product runs): for a benchmark that runs
    all its systems under one tier (`--tier`)."""
    caps = TIERS[tier]
    if all(os.environ.get(k) == v for k, v in caps.items()):
        return
    print(f"tier {tier}: {' '.join(f'{k}={v}' for k, v in caps.items())}", file=sys.stderr)
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **caps})


def child(command: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run `command` with `env` added to this environment; its last stdout line, parsed as JSON,
    with the load average before and after."""
    before = os.getloadavg()[0]
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    done = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *path]), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found["load"] = (before, os.getloadavg()[0])
    return found


def run_tier(tier: str, args: argparse.Namespace) -> dict[str, dict]:
    results = {}
    systems = GPT1 + (CT2 if CT2_FROM[tier] == tier else ())
    for system in systems:
        env = dict(TIERS[tier])
        if system == "gpt1:int8" and args.int8_float_products:
            env["GPT1_INT8_MATMUL"] = "0"
        command = [sys.executable, str(HERE / "generate_alone.py"), system, "--json"]
        command += ["--repeats", str(args.repeats), "--new-tokens", str(args.new_tokens)]
        command += ["--threads", str(args.threads)]
        try:
            results[system] = child(command, env, args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:  # the other systems still run
            print(f"  {tier:9s} {system:12s} failed: {str(e).strip().splitlines()[-1]}")
            continue
        found = results[system]
        load, steps = found["load"], found.get("decode_tokens_per_s")
        print(
            f"  {tier:9s} {system:12s} {found['tokens_per_s']:7.1f} tokens/s"
            + (f", steps {steps:.1f}, read {found['bandwidth'] / 1e9:.1f} GB/s" if steps else "")
            + f" (load average {load[0]:.1f} -> {load[1]:.1f})",
            flush=True,
        )
    return results


def table(tier: str, results: dict[str, dict], ct2: dict[str, dict]) -> str:
    """One tier as a markdown table: tokens/s, the ratio to CTranslate2 of the same kind (fp32
    and bf16 to its float32, int8 to its int8), the bandwidth bound, and the share of it that
    the decoding steps reach (tokens/s after the first token: the bound is a bound on a step,
    the prompt's forward pass is not a read of the weights once) and the whole generation."""
    lines = [
        "| system | tokens/s | vs CTranslate2 | decoding steps (tokens/s) | bound (tokens/s) "
        "| steps' share of bound | whole generation's share |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, found in results.items():
        rate = found["tokens_per_s"]
        ratio = steps = bound = share = whole = ""
        if system in GPT1:
            peer = "ct2:int8" if system == "gpt1:int8" else "ct2:float32"
            if peer in ct2:
                ratio = f"{rate / ct2[peer]['tokens_per_s']:.2f}x {peer[4:]}"
            limit = found["bandwidth"] / found["decode_bytes"]
            step_rate = found["decode_tokens_per_s"]
            steps, bound = f"{step_rate:.1f}", f"{limit:.1f}"
            share, whole = f"{step_rate / limit:.0%}", f"{rate / limit:.0%}"
        lines.append(f"| {system} | {rate:.1f} | {ratio} | {steps} | {bound} | {share} | {whole} |")
    floats = [results[s]["tokens_per_s"] for s in ("gpt1:fp32", "gpt1:bf16") if s in results]
    if floats and "gpt1:int8" in results:
        best = results["gpt1:int8"]["tokens_per_s"] / max(floats)
        lines += ["", f"gpt1 int8 / gpt1's best float: {best:.2f}x"]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiers", default=",".join(TIERS), help=f"of {','.join(TIERS)}")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="per system")
    p.add_argument("--int8-float-products", action="store_true")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per child")
    args = p.parse_args()
    tiers = args.tiers.split(",")
    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        p.error(f"unknown tier(s) {', '.join(unknown)}: choose from {', '.join(TIERS)}")
    results = {}
    for tier in tiers:
        results[tier] = run_tier(tier, args)
    for tier in tiers:
        ct2_tier = CT2_FROM[tier]
        ct2 = {s: r for s, r in results.get(ct2_tier, {}).items() if s in CT2}
        print(f"\n### {tier} ({json.dumps(TIERS[tier])})\n")
        print(table(tier, results[tier], ct2))
    if "no-kernel" in results and "torch-ops" in results:
        print("\nno-kernel / torch-ops (never below 1.00x):", floor_ratios(results))


def floor_ratios(results: dict[str, dict]) -> str:
    """Each gpt1 precision's rate without the kernel over its rate on torch's own operators."""
    pairs = []
    for system in GPT1:
        fast, plain = results["no-kernel"].get(system), results["torch-ops"].get(system)
        if fast and plain:
            pairs.append(f"{system[5:]} {fast['tokens_per_s'] / plain['tokens_per_s']:.2f}x")
    return ", ".join(pairs)


if __name__ == "__main__":
    main()
