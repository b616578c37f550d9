"""Does a lower precision keep a model's quality? bf16 and int8 against fp32, on trained models.

For a fine-tuned RUN (`--run`): loads it through the server's engine in each precision,
predicts a split of its task and prints the share of examples whose label is the same as
fp32's, the largest probability (or score) difference, and the task's metrics under each
precision when the split is labelled.

For a pretrained checkpoint (`--lm`) with a prepared folder (`--prepared`, from `gpt1 prepare`):
the validation perplexity in each precision (the loss through each precision's own output
layer: int8's is the int8 token table), and greedy generations from prompts taken from the
validation text: how many tokens each precision's generation follows fp32's before the first
difference.

    python benchmarks/precision_agreement.py --run runs/sst2 --data ../shared/data/glue/SST-2
    python benchmarks/precision_agreement.py --lm runs/mini/final --prepared data/novels --prompts 16
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpt1.checkpoint_files import open_checkpoint  # noqa: E402
from gpt1.inference.generate import generate  # noqa: E402
from gpt1.inference.prediction import predict_raw  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402
from gpt1.model.checkpoint import load_model  # noqa: E402
from gpt1.serve.engine import load_engine  # noqa: E402
from gpt1.tasks.batches import encode_split  # noqa: E402
from gpt1.tasks.metrics import compute  # noqa: E402
from gpt1.text.windows import open_prepared, validation_windows  # noqa: E402


def classifier_agreement(run: str, data: str, split: str, micro: int, precisions) -> None:
    engines = {name: load_engine(run, precision=name) for name in ("fp32", *precisions)}
    base = engines["fp32"]
    task = base.task
    if task is None:
        raise SystemExit(f"{run} is not a fine-tuned run")
    record = base.classifier.record
    for name in task.resolve_splits(split):
        sp = task.read(data, name, need_labels=None)
        enc = encode_split(
            sp, task, base.tokenizer, record["n_ctx"], record.get("question_delimiter", False)
        )
        out, seconds = {}, {}
        for precision, engine in engines.items():
            start = time.perf_counter()
            out[precision] = torch.tensor(
                predict_raw(engine.classifier.model, task, enc, micro), dtype=torch.float64
            )
            seconds[precision] = time.perf_counter() - start
        ref = out["fp32"]
        for precision, got in out.items():
            if task.regression:
                labels, same = got, float(((got - ref).abs() < 5e-4).double().mean())
                diff = (got - ref).abs().max()
            else:
                labels = got.argmax(-1)
                same = float((labels == ref.argmax(-1)).double().mean())
                diff = (got.softmax(-1) - ref.softmax(-1)).abs().max()
            line = (
                f"{task.name}/{name} {precision}: {len(enc.items)} examples, agrees with fp32 "
                f"on {same:.2%}, largest {'score' if task.regression else 'probability'} "
                f"difference {float(diff):.4f}, {seconds[precision]:.1f} s"
            )
            if sp.labelled:
                metrics = compute(task.metrics, labels.tolist(), enc.labels)
                line += "; " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            print(line)


@torch.inference_mode()
def perplexity(model, windows: torch.Tensor, micro: int) -> float:
    total, count = 0.0, 0
    for start in range(0, len(windows), micro):
        rows = windows[start : start + micro]
        logits = model.lm_logits(model(rows[:, :-1])).float()  # [B, T, V]
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum"
        )
        total, count = total + float(loss), count + rows[:, 1:].numel()
    return math.exp(total / count)


def lm_agreement(lm: str, data: str, windows: int, prompts: int, new: int, precisions) -> None:
    prepared = open_prepared(data)
    models = {
        name: for_inference(load_model(open_checkpoint(lm)), "cpu", name)
        for name in ("fp32", *precisions)
    }
    n_ctx = min(models["fp32"].config.n_positions, 128)
    rows = validation_windows(prepared.splits["val"], n_ctx, windows)
    ppl = {name: perplexity(model, rows, 16) for name, model in models.items()}
    for name, value in ppl.items():
        print(
            f"validation perplexity {name}: {value:.3f} ({len(rows)} windows of {n_ctx} tokens; "
            f"{value / ppl['fp32'] - 1:+.2%} vs fp32)"
        )
    picks = rows[:: max(1, len(rows) // prompts)][:prompts, :32]  # [prompts, 32]
    length = min(new, models["fp32"].config.n_positions - 32)
    with torch.inference_mode():
        ref = [generate(models["fp32"], p[None], length, temperature=0)[0, 32:] for p in picks]
        for name, model in models.items():
            if name == "fp32":
                continue
            runs = []
            for p, want in zip(picks, ref):
                got = generate(model, p[None], length, temperature=0)[0, 32:]
                differ = (got != want).nonzero()
                runs.append(int(differ[0]) if len(differ) else length)
            print(
                f"greedy {name} vs fp32, {len(picks)} prompts of 32 tokens, {length} new: tokens "
                f"until the first difference median {statistics.median(runs):.0f}, min "
                f"{min(runs)}; identical in {sum(r == length for r in runs)}"
            )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--run", help="a fine-tuned run folder")
    p.add_argument("--data", help="the task's data folder (for --run)")
    p.add_argument("--split", default="dev")
    p.add_argument("--lm", help="a pretrained checkpoint")
    p.add_argument("--prepared", help="its `gpt1 prepare` folder (for --lm: the validation split)")
    p.add_argument("--windows", type=int, default=256, help="validation windows (0: all)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--precisions", default="bf16,int8")
    p.add_argument("--micro-batch", type=int, default=64)
    args = p.parse_args()
    precisions = args.precisions.split(",")
    if args.run:
        classifier_agreement(args.run, args.data, args.split, args.micro_batch, precisions)
    if args.lm:
        lm_agreement(
            args.lm, args.prepared, args.windows, args.prompts, args.new_tokens, precisions
        )


if __name__ == "__main__":
    main()
