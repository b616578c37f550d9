"""Tokens per second a pretraining run can draw from text files read directly (`gpt1.text.stream`,
tokenizing in the training process or in worker processes) next to the same windows read from
`gpt1 prepare`'s shards of the same files (`SequentialWindows`), in one process.

    python benchmarks/stream_throughput.py                          # 3 Gutenberg novels, GPT-1 vocabulary
    python benchmarks/stream_throughput.py --files 6 --workers 1 2 4
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))


def draw(source, windows: int, micro: int) -> float:
    """Seconds to take `windows` windows of n_ctx tokens, `micro` at a time."""
    started = time.perf_counter()
    for _ in range(windows // micro):
        source.next_batch(micro)
    return time.perf_counter() - started


def main() -> None:
    from gpt1.config import DataConfig
    from gpt1.text.prepare import PrepareOptions, prepare
    from gpt1.text.stream import TextWindows, open_data
    from gpt1.text.windows import SequentialWindows, open_prepared

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=SHARED / "corpus" / "gutenberg")
    p.add_argument("--vocab", type=Path, default=SHARED / "gpt1_tokenizer")
    p.add_argument("--files", type=int, default=3, help="the first N .txt files of --corpus")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--n-ctx", type=int, default=512)
    p.add_argument("--micro", type=int, default=8)
    args = p.parse_args()
    files = sorted(args.corpus.glob("*.txt"))[: args.files]
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text"
        text.mkdir()
        for f in files:
            (text / f.name).symlink_to(f.resolve())
        opts = PrepareOptions(val_fraction=0, strip_gutenberg=True, quiet=True)
        prepare([text], args.vocab, Path(tmp) / "prepared", opts)
        split = open_prepared(Path(tmp) / "prepared").splits["train"]
        windows = (split.tokens // args.n_ctx) // args.micro * args.micro  # one pass
        cfg = DataConfig(path=str(text), tokenizer=str(args.vocab), strip_gutenberg=True)
        data = open_data(cfg)
        rows = [
            (
                "prepared shards, sequential",
                draw(SequentialWindows(split, args.n_ctx), windows, args.micro),
            )
        ]
        for w in args.workers:
            stream = TextWindows(data, args.n_ctx, workers=w)
            rows.append(
                (f"text files, {w} tokenizing process(es)", draw(stream, windows, args.micro))
            )
    tokens = windows * args.n_ctx
    print(f"{len(files)} files, {tokens:,} tokens in {windows:,} windows of {args.n_ctx}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| source | seconds | tokens/s |\n|---|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.1f} | {tokens / seconds:,.0f} |")


if __name__ == "__main__":
    main()
