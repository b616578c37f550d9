"""Commands beside other CPU-bound jobs: torch's thread default against `--threads auto`.

The script starts the load itself (`--load N` busy processes, default 2: on a 2-core machine the
fair share of a 1-process job is then 2/3 of a core, so 1.5x-2x its time alone is fair) and runs
each workload as a real `gpt1` command, alone and under that load, with each policy: `torch`,
torch's default (`--threads` = every usable CPU, each thread spinning at barriers: gpt1's
behaviour before `--threads auto`), `passive` (the same with OMP_WAIT_POLICY=PASSIVE), `one`
(`--threads 1`) and `auto` (gpt1's default). Within a round the runs alternate, so that other
users' load hits all alike; the median over rounds is printed, with the 1-minute load
average the machine showed before each run (the load this script adds is not in "alone" figures,
but other users' jobs are: say so when quoting them).

    python benchmarks/threads.py                         # train + sample + evaluate, 1 round
    python benchmarks/threads.py --rounds 3 --steps 100  # the training run of the figures
    python benchmarks/threads.py --workloads demo --policies auto   # `gpt1 demo` (minutes)
    python benchmarks/threads.py --workloads tests       # pytest -n 2 on a few test files

Workloads: `train` (pretrain 4 layers x 128 wide, context 64, batch 8, `--steps` updates, on a
synthetic corpus), `sample` (100 new tokens from it), `evaluate` (a classifier fine-tuned from it
for 2 updates, scored on SST-2's 872 dev sentences: the loop `predict` runs), `demo`
(`gpt1 demo`), `tests` (`pytest -n 2` on TEST_FILES; the suite sets its own threads in
tests/conftest.py, so it runs once per condition, reported under `auto`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))
TEST_FILES = ["tests/test_threads.py", "tests/test_sample_cli.py", "tests/test_heads.py"]
MODEL = ["--set", "model.n_layer=4", "--set", "model.n_embd=128", "--set", "model.n_head=4"]
CPUS = str(len(os.sched_getaffinity(0)))
# policy -> (flags, environment): torch's default count; the same with OpenMP's passive waiting
# (set before torch loads OpenMP); one fixed thread; gpt1's default.
POLICIES = {
    "torch": (["--threads", CPUS], {}),
    "passive": (["--threads", CPUS], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "one": (["--threads", "1"], {}),
    "auto": ([], {}),
}


def env() -> dict[str, str]:
    """This checkout, and no thread settings inherited from the shell (they would decide)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "GPT1_THREADS")}
    return {**clean, "PYTHONPATH": str(ROOT)}


def gpt1(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpt1", *args, "--quiet"]


def setup(work: Path, steps: int) -> dict[str, list[str]]:
    """The corpus, a pretrained run and a fine-tuned classifier the workloads read."""
    from helpers.tiny import make_corpus

    corpus = make_corpus(work / "corpus", vocab=189)  # the size of its character vocabulary
    base = [*gpt1("pretrain", "--preset", "tiny", "--data", str(corpus)), *MODEL]
    base += ["--set", "data.n_ctx=64", "--batch-size", "8", "--micro-batch", "8"]
    base += ["--eval-every", "0", "--save-every", "0", "--overwrite", "--threads", "1"]
    subprocess.run(
        [*base, "--out", str(work / "lm"), "--max-steps", "2"],
        check=True,
        env=env(),
        capture_output=True,
    )
    finetune = gpt1("finetune", "--task", "sst2", "--data", str(SHARED / "glue" / "SST-2"))
    finetune += ["--init", str(work / "lm"), "--out", str(work / "clf"), "--threads", "1"]
    subprocess.run(
        [*finetune, "--train-examples", "64", "--max-steps", "2"],
        check=True,
        env=env(),
        capture_output=True,
    )
    train = [*base[: base.index("--threads")], "--out", str(work / "train")]
    return {
        "train": [*train, "--max-steps", str(steps)],
        "sample": [*gpt1("sample", str(work / "lm")), "--prompt-ids", "1 2 3"]
        + ["--max-new-tokens", "100", "--seed", "1"],
        "evaluate": gpt1("evaluate", str(work / "clf"), "--data", str(SHARED / "glue" / "SST-2"))
        + ["--split", "dev", "--out", str(work / "eval"), "--overwrite"],
        "demo": [*gpt1("demo", "--out", str(work / "demo")), "--overwrite"],
        "tests": [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider"]
        + TEST_FILES,
    }


def fresh_output(command: list[str]) -> None:
    """Remove the --out folder of the last run: `gpt1 demo` would reuse its finished steps."""
    if "--out" in command:
        shutil.rmtree(command[command.index("--out") + 1], ignore_errors=True)


def timed(command: list[str], policy: str) -> tuple[float, float]:
    """Wall seconds of one run, and the 1-minute load average just before it."""
    fresh_output(command)
    load = os.getloadavg()[0]
    flags, variables = POLICIES[policy]
    extra = flags if command[1:3] == ["-m", "gpt1"] else []
    variables = {**env(), **variables}
    start = time.perf_counter()
    done = subprocess.run([*command, *extra], env=variables, cwd=ROOT, capture_output=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr.decode()[-2000:]}")
    return seconds, load


def start_load(n: int) -> list[subprocess.Popen]:
    busy = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(busy) for _ in range(n)]
    time.sleep(1.0)
    return procs


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def run_round(commands: dict, names: list[str], policies: list[str], load: int) -> list[tuple]:
    """One alone/loaded pass over every workload and policy, alternating policies."""
    rows = []
    for name in names:
        for loaded in (False, True):
            procs = start_load(load) if loaded else []
            try:
                for policy in policies if name != "tests" else ["auto"]:
                    seconds, avg = timed(commands[name], policy)
                    rows.append((name, policy, loaded, seconds, avg))
                    print(
                        f"  {name:8} {policy:5} {'load' if loaded else 'alone':5}"
                        f" {seconds:8.1f} s  (load average before: {avg:.1f})",
                        flush=True,
                    )
            finally:
                stop_load(procs)
    return rows


def report(rows: list[tuple], names: list[str], policies: list[str]) -> None:
    def med(name, policy, loaded, col=3):
        vals = [r[col] for r in rows if r[:3] == (name, policy, loaded)]
        return statistics.median(vals)

    print(
        "\nworkload  policy   alone s (load avg)   loaded s (load avg)   loaded/alone"
        "   loaded / torch alone"
    )
    for name in names:
        for policy in policies if name != "tests" else ["auto"]:
            alone, loaded = med(name, policy, False), med(name, policy, True)
            base = med(name, policies[0] if name != "tests" else "auto", False)
            print(
                f"{name:9} {policy:6} {alone:9.1f} ({med(name, policy, False, 4):4.1f})"
                f"       {loaded:9.1f} ({med(name, policy, True, 4):4.1f})"
                f"        {loaded / alone:5.2f}x        {loaded / base:5.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="train,sample,evaluate")
    parser.add_argument("--policies", default="torch,auto", help=", ".join(POLICIES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30, help="updates in the train workload")
    parser.add_argument("--load", type=int, default=2, help="busy processes started beside")
    args = parser.parse_args()
    names, policies = args.workloads.split(","), args.policies.split(",")
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # gpt1, and the tests' tiny inputs
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}  usable CPUs: {len(os.sched_getaffinity(0))}"
        f"  load: {args.load} busy processes  policies: {', '.join(policies)}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        commands = setup(Path(tmp), args.steps)
        rows = []
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            rows += run_round(commands, names, policies, args.load)
    report(rows, names, policies)


if __name__ == "__main__":
    main()
