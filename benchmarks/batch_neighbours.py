"""How much a served prediction depends on the requests batched with it, per precision.

`gpt1 serve` joins concurrent predict requests into one batch (`--batch-items`, 16), so a
sentence's probabilities are computed beside other sentences. For each precision this predicts
every sentence alone (a batch of one) and in batches of `--batch` SST-2 dev sentences (as the
server's worker does: `Engine.predict`, the function behind `gpt1 predict`), and prints the
largest difference of a probability between the two and how many labels differ.

    python benchmarks/batch_neighbours.py --run runs/sst2                  # a fine-tuned run
    python benchmarks/batch_neighbours.py --preset gpt1 --sentences 64      # GPT-1 size, random weights
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serve import DATA, sentences, write_run  # noqa: E402  (the serving benchmark's run)

from gpt1.serve.engine import load_engine  # noqa: E402


def differences(run: Path, precision: str, texts: list[str], batch: int) -> tuple[float, int]:
    """(largest probability difference, labels that differ) between alone and batched."""
    engine = load_engine(run, device="cpu", precision=precision)
    items = engine.encode(engine.examples([{"text": t} for t in texts]))
    alone = [engine.predict([item], micro=1)[0] for item in items]
    together = engine.predict(items, micro=batch)
    largest = max(
        abs(a - b)
        for x, y in zip(alone, together)
        for a, b in zip(x.probabilities, y.probabilities)
    )
    return largest, sum(x.label != y.label for x, y in zip(alone, together))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run", type=Path, help="a fine-tuned SST-2 run (default: random weights)")
    p.add_argument("--preset", default="gpt1", help="model size of the random-weight run")
    p.add_argument("--sentences", type=int, default=64, help="SST-2 dev sentences (default 64)")
    p.add_argument("--batch", type=int, default=16, help="sentences per batch (default 16)")
    p.add_argument("--precisions", default="fp32,bf16,int8")
    args = p.parse_args()
    torch.manual_seed(0)
    texts = sentences()[: args.sentences]
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run or write_run(Path(tmp) / "sst2", args.preset)
        print(f"{len(texts)} SST-2 dev sentences ({DATA}), batches of {args.batch}, {run}")
        print(f"{'precision':>10} {'largest |p alone - p batched|':>30} {'labels differ':>14}")
        for precision in args.precisions.split(","):
            largest, labels = differences(run, precision, texts, args.batch)
            print(f"{precision:>10} {largest:>30.2e} {labels:>14}")


if __name__ == "__main__":
    main()
