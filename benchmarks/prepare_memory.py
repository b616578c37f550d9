"""Peak memory of `gpt1 prepare` on a corpus and on one N times larger, side by side.

The larger corpus is generated into a temporary folder: N copies of every file, the first the
original, the others with their paragraphs shuffled (seeded), so documents keep their sizes
while the corpus grows N-fold. Each case runs `python -m gpt1 prepare` in its own process tree;
a sampler reads the resident memory of the main process and every worker process (psutil) every
20 ms and keeps the peak of their sum, next to the command's own maxrss (its largest single
process, from wait4). With `--limit-as BYTES` the runs are made under that address-space limit
(setrlimit RLIMIT_AS, as `prlimit --as` sets it; inherited by the workers).

    python benchmarks/prepare_memory.py                       # gutenberg and 10x gutenberg, 2 workers
    python benchmarks/prepare_memory.py --factor 3 --workers 1 --limit-as 3000000000
    python benchmarks/prepare_memory.py --cache-check    # one process: tokenizer cache and RSS per pass
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))


def grow_corpus(src: Path, dst: Path, factor: int) -> int:
    """Write `factor` copies of every .txt file under `src` into `dst`; returns the bytes written."""
    written = 0
    for path in sorted(src.rglob("*.txt")):
        text = path.read_text(encoding="utf-8", errors="replace")
        paragraphs = text.split("\n\n")
        for copy in range(factor):
            if copy:
                random.Random(copy).shuffle(paragraphs)
            out = dst / f"copy{copy:02d}" / path.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            written += out.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return written


class TreeSampler(threading.Thread):
    """Peak of the summed RSS of a process and all its descendants, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.peak = 0
        self.peak_processes = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for proc in procs:
                try:
                    total += proc.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            if total > self.peak:
                self.peak, self.peak_processes = total, len(procs)
            time.sleep(0.02)


def run_prepare(corpus: Path, out: Path, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable, "-m", "gpt1", "prepare", "--corpus", str(corpus),
        "--vocab", str(args.vocab), "--out", str(out), "--workers", str(args.workers),
        "--val-fraction", "0.005", "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

    def limit() -> None:
        if args.limit_as:
            resource.setrlimit(resource.RLIMIT_AS, (args.limit_as, args.limit_as))

    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, preexec_fn=limit, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    err = proc.stderr.read()
    # wait4: this command's own rusage; its maxrss is that of its largest process (workers included)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"prepare failed ({proc.returncode}): {err.strip()[-2000:]}")
    tokens = (
        sum(f.stat().st_size - 64 for f in out.glob("*.bin")) // 2
    )  # uint16 ids (vocabularies up to 65,536)
    return {
        "seconds": time.perf_counter() - started,
        "tree_peak": sampler.peak,
        "processes": sampler.peak_processes,
        "largest_process": usage.ru_maxrss * 1024,
        "tokens": tokens,
    }


def cache_check(corpus: Path, vocab: Path, passes: int) -> None:
    """Encode the corpus `passes` times in this process (pass k > 0: paragraphs shuffled, as the
    larger corpus is made) and print the tokenizer's cache size and RSS after each pass."""
    sys.path.insert(0, str(ROOT))
    from gpt1.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(vocab)
    for copy in range(passes):
        for path in sorted(corpus.rglob("*.txt")):
            paragraphs = path.read_text(encoding="utf-8", errors="replace").split("\n\n")
            if copy:
                random.Random(copy).shuffle(paragraphs)
            tok.encode("\n\n".join(paragraphs))
        rss = psutil.Process().memory_info().rss
        print(f"pass {copy + 1}: {len(tok._cache):,} cached units, RSS {rss / 2**20:,.0f} MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=SHARED / "corpus" / "gutenberg")
    p.add_argument("--vocab", type=Path, default=SHARED / "gpt1_tokenizer")
    p.add_argument("--factor", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--limit-as", type=int, default=0, help="RLIMIT_AS in bytes (0: none)")
    p.add_argument("--tmp", type=Path, default=None, help="where to write (default: $TMPDIR)")
    p.add_argument("--cache-check", type=int, nargs="?", const=2, default=0, metavar="PASSES")
    args = p.parse_args()
    if args.cache_check:
        return cache_check(args.corpus, args.vocab, args.cache_check)
    work = Path(tempfile.mkdtemp(prefix="prepare-memory-", dir=args.tmp))
    try:
        big = work / "corpus"
        size = grow_corpus(args.corpus, big, args.factor)
        small_size = sum(f.stat().st_size for f in args.corpus.rglob("*.txt"))
        rows = [
            ("1x", small_size, run_prepare(args.corpus, work / "small", args)),
            (f"{args.factor}x", size, run_prepare(big, work / "big", args)),
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"workers {args.workers}, RLIMIT_AS {args.limit_as or 'none'}, load {os.getloadavg()}")
    print("| corpus | MiB | tokens | seconds | peak RSS, all processes | largest process |")
    print("|---|---|---|---|---|---|")
    for name, nbytes, r in rows:
        largest = f"{r['largest_process'] / 2**20:,.0f} MiB"
        print(
            f"| {name} | {nbytes / 2**20:,.1f} | {r['tokens']:,} | {r['seconds']:,.0f} | "
            f"{r['tree_peak'] / 2**20:,.0f} MiB ({r['processes']} processes) | {largest} |"
        )
    ratio = rows[1][2]["tree_peak"] / rows[0][2]["tree_peak"]
    print(f"peak ratio {args.factor}x / 1x: {ratio:.3f}")


if __name__ == "__main__":
    main()
