"""Does `gpt1 serve --precision bf16` keep a fine-tuned run's predictions? Agreement with fp32.

Loads RUN twice through the server's engine (fp32 and bf16), predicts a split of its task and
prints: the share of examples whose label is the same, the largest probability (or score)
difference, and the task's metrics under each precision when the split is labelled.

    python benchmarks/bf16_agreement.py runs/sst2 --data ../shared/data/glue/SST-2 --split dev
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpt1.recipes.evaluate import predict_raw  # noqa: E402
from gpt1.serve.engine import load_engine  # noqa: E402
from gpt1.tasks.batches import encode_split  # noqa: E402
from gpt1.tasks.metrics import compute  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run")
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="dev")
    p.add_argument("--micro-batch", type=int, default=64)
    args = p.parse_args()
    engines = {name: load_engine(args.run, precision=name) for name in ("fp32", "bf16")}
    task = engines["fp32"].task
    if task is None:
        raise SystemExit(f"{args.run} is not a fine-tuned run")
    record = engines["fp32"].record
    for name in task.resolve_splits(args.split):
        sp = task.read(args.data, name, need_labels=None)
        enc = encode_split(
            sp,
            task,
            engines["fp32"].tokenizer,
            record["n_ctx"],
            record.get("question_delimiter", False),
        )
        out, seconds = {}, {}
        for precision, engine in engines.items():
            start = time.perf_counter()
            out[precision] = predict_raw(engine.classifier, task, enc, args.micro_batch)
            seconds[precision] = time.perf_counter() - start
        a, b = (torch.tensor(out[k], dtype=torch.float64) for k in ("fp32", "bf16"))
        if task.regression:
            labels_a, labels_b, diff = a, b, (a - b).abs().max()
            same = float(((a - b).abs() < 5e-4).double().mean())  # equal at 3 decimals
        else:
            labels_a, labels_b = a.argmax(-1), b.argmax(-1)
            same = float((labels_a == labels_b).double().mean())
            diff = (a.softmax(-1) - b.softmax(-1)).abs().max()
        print(
            f"{task.name}/{name}: {len(enc.items)} examples, bf16 agrees with fp32 on "
            f"{same:.2%}; largest {'score' if task.regression else 'probability'} difference "
            f"{float(diff):.4f}; fp32 {seconds['fp32']:.1f} s, bf16 {seconds['bf16']:.1f} s"
        )
        if sp.labelled:
            for precision, preds in (("fp32", labels_a), ("bf16", labels_b)):
                metrics = compute(task.metrics, preds.tolist(), enc.labels)
                print(f"  {precision}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))


if __name__ == "__main__":
    main()
