"""Fault report: crashes, hostile files, full disks, second writers, and what they cost.

Three parts, each printed as a table (machinery in tests/helpers/faults.py and
tests/helpers/fault_cases.py, shared with tests/test_faults.py and tests/test_fuzz.py):

1. `gpt1 pretrain` and `gpt1 finetune` (tiny preset, tiny data) SIGKILLed again and again at random
   moments -- a third of the kills aimed at the instant a checkpoint is being written -- resuming
   each time with `--resume auto`; every checkpoint on disk is verified after every kill, and the
   end result is compared bitwise with an uninterrupted run.
2. Fault cases (case, outcome, data lost): overwrite attempts (convert, pretrain, evaluate,
   predict, plot, zeroshot), two processes or two torchrun launches on one run folder, a
   SIGKILLed lock holder, a full disk and a read-only folder (real private tmpfs mounts where
   `unshare -rm` is allowed, simulated otherwise), the umask; hostile files (sizes and types in
   config.json, HF config.json, params_shapes.json and task.json, NaN weights, token ids beyond
   the vocabulary, an index.json pointing outside its folder), each a real command that must
   exit 2 with one line, timed where speed is the point; 100,000 `!` through `tokenizer encode`;
   bad rows (a list label, duplicated keys and header names, 10 MB fields); every writing command
   with its output on one of its inputs; refused or failed runs and resumes (nothing left
   behind); resumes that would change the run; SIGINT/SIGTERM mid-publish; meta.json counts.
3. Every dataset reader fed mutated copies of real files from ../shared/data (truncated lines,
   wrong column counts, wrong encodings, huge fields, empty files, random byte damage): each must
   parse or raise a `Gpt1Error`, within a time limit.

    .venv/bin/python benchmarks/faults.py                 # 20 kills per command, 200 inputs per reader
    .venv/bin/python benchmarks/faults.py --kills 4 --inputs 30
    .venv/bin/python benchmarks/faults.py --only cases    # just the fault-case table
    .venv/bin/python benchmarks/faults.py --only cases --case outputs_onto_inputs   # one row
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run from a checkout without installing; the fault harness lives with the tests (tests/helpers).
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
SHARED = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))

from helpers.fault_cases import CASES, run_cases  # noqa: E402
from helpers.faults import finetune_faults, fuzz_readers, pretrain_faults  # noqa: E402


# ================================================================================== report
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs per command")
    parser.add_argument("--inputs", type=int, default=200, help="mutated files per reader")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only", choices=["kills", "cases", "readers"], help="run one part of the report"
    )
    parser.add_argument("--skip-kills", action="store_true", help="same as leaving out part 1")
    parser.add_argument(
        "--case", action="append", default=[], help="only this fault case (its function name)"
    )
    args = parser.parse_args()
    parts = (
        {args.only}
        if args.only
        else {"kills", "cases", "readers"} - ({"kills"} if args.skip_kills else set())
    )
    t0 = time.time()
    lost = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"# gpt1 fault report (seed {args.seed})\n")
        if "kills" in parts:
            print("## SIGKILL at random moments, resume with --resume auto\n")
            print(
                "| command | kills survived | of which mid-checkpoint | resumes | checkpoints "
                "verified | steps recomputed | data lost |"
            )
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
            for fn in (pretrain_faults, finetune_faults):
                r = fn(work / fn.__name__, args.kills, args.seed)
                lost += r.data_lost
                print(
                    f"| gpt1 {r.command} | {r.kills} | {r.kills_in_write} | {r.resumes} | "
                    f"{r.checkpoints_verified} | {r.steps_redone} | {r.data_lost} |",
                    flush=True,
                )
                for p in r.problems:
                    print(f"  - {p}")
            print(
                "\nFinal result of every killed run equals the uninterrupted run (metrics lines, "
                "final weights"
                + (", results.json" if True else "")
                + ", bitwise): "
                + ("yes" if lost == 0 else "NO")
            )
        if "cases" in parts:
            print("\n## Fault cases\n")
            print("| case | outcome | data lost |")
            print("| --- | --- | ---: |")
            chosen = [c for c in CASES if not args.case or c[1].__name__ in args.case]
            for name, r in run_cases(work / "cases", chosen):
                lost += r.data_lost + (1 if r.problems and not r.data_lost else 0)
                print(f"| {name} | {r.outcome} | {r.data_lost} |", flush=True)
            print(
                f"\n`{' '.join(['.venv/bin/python', 'benchmarks/faults.py', *sys.argv[1:]])}`, "
                f"{time.strftime('%Y-%m-%d')}"
            )
        if "readers" in parts and SHARED.is_dir():
            print("\n## Mutated real files per reader (parse, or raise the project's own error)\n")
            print("| reader | inputs tried | parsed | clean error | crash or hang |")
            print("| --- | ---: | ---: | ---: | ---: |")
            for name, n, ok, err, failures in fuzz_readers(
                SHARED, work / "fuzz", args.inputs, args.seed
            ):
                lost += len(failures)
                print(f"| {name} | {n} | {ok} | {err} | {len(failures)} |", flush=True)
                for f in failures[:5]:
                    print(f"  - {f[:300]}")
        elif "readers" in parts:
            print(f"\n(shared data not found at {SHARED}: reader fuzzing skipped)")
    print(f"\ndata lost / failures: {lost}   ({time.time() - t0:.0f} s)")
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
