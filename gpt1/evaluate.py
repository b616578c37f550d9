"""`gpt1 evaluate` and `gpt1 predict`: score a fine-tuned run on a split, write submissions.

Results go to `results.json` in the run folder: {"task", "split", "n", metric: value, ...}.
When a split stands for several files (MNLI's matched and mismatched dev sets) the first one's
metrics are the top-level entries and each file also has its own entry.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from gpt1.errors import ConfigError
from gpt1.tasks.metrics import compute
from gpt1.tasks.registry import Task, get_task

# GLUE's submission file names (https://gluebenchmark.com/submit); others use the task name.
GLUE_FILES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
              "mnli/test_matched": "MNLI-m", "mnli/test_mismatched": "MNLI-mm", "qnli": "QNLI",
              "rte": "RTE", "wnli": "WNLI", "story_cloze": "ROCStories"}


@torch.no_grad()
def predict_outputs(model: Any, task: Task, enc: Any, micro: int) -> list[Any]:
    """Predicted class index (or choice index, or score) per example, in order.

    Batches are formed longest first, so each pads to a similar length (right padding does not
    reach a causal model's real positions, so an example's output does not depend on its
    batch); the predictions are put back in the split's order.
    """
    from gpt1.finetune import example_length, make_batch
    device = next(model.parameters()).device
    order = sorted(range(len(enc.items)), key=lambda i: -example_length(enc.items[i]))
    preds: list[Any] = [None] * len(order)
    for start in range(0, len(order), micro):
        index = order[start:start + micro]
        batch = make_batch(enc, index, task.regression)
        out, _ = model(batch["ids"].to(device), batch["mask"].to(device), with_lm=False)
        out = out.float().cpu()
        for i, p in zip(index, out.tolist() if task.regression else out.argmax(-1).tolist()):
            preds[i] = p
    return preds


def score(model: Any, task: Task, enc: Any, micro: int) -> dict[str, float]:
    """The task's metrics on an encoded labelled split, plus `n`."""
    preds = predict_outputs(model, task, enc, micro)
    return {"n": len(preds), **compute(task.metrics, preds, enc.labels)}


def evaluate_model(model: Any, task: Task, tok: Any, data: str, split: str, n_ctx: int,
                   question_delimiter: bool, micro: int, skip_bad_rows: bool = False) -> dict[str, Any]:
    """Metrics of `model` on `split` of `task` (all files it stands for)."""
    from gpt1.finetune import encode_split, report_skipped
    results: dict[str, Any] = {"task": task.name, "split": split}
    for i, name in enumerate(task.resolve_splits(split)):
        sp = task.read(data, name, skip_bad_rows, need_labels=True)
        report_skipped(sp)
        metrics = score(model, task, encode_split(sp, task, tok, n_ctx, question_delimiter), micro)
        metrics["skipped"] = len(sp.skipped)
        if i == 0:
            results.update(metrics)
        if len(task.resolve_splits(split)) > 1:
            results[name] = metrics
    return results


def write_results(run: str | Path, results: dict[str, Any]) -> Path:
    path = Path(run) / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path


def _run_folder(run: str | Path) -> Path:
    """The run folder that holds a fine-tuned checkpoint (RUN or RUN/final given)."""
    from gpt1.checkpoint import resolve_checkpoint_dir
    folder = resolve_checkpoint_dir(run)
    return folder.parent if Path(run).resolve() != folder.resolve() else folder


def _task_of(record: dict, name: str | None) -> Task:
    task = get_task(record["task"], record.get("spec") or None)
    if name and get_task(name, record.get("spec") or None).name != task.name:
        raise ConfigError(f"this run was fine-tuned on {task.name!r}, not {name!r}")
    return task


def _place(model: Any, device: str, precision: str) -> Any:
    """The model on `device` in `precision` (both may be "auto": see gpt1.devices)."""
    from gpt1.devices import resolve_device, resolve_precision, torch_dtype
    where = resolve_device(device)
    return model.to(device=where, dtype=torch_dtype(resolve_precision(precision, where)))


def evaluate_run(run: str | Path, task_name: str | None, data: str, split: str = "dev",
                 micro: int = 16, skip_bad_rows: bool = False, device: str = "auto",
                 precision: str = "auto") -> dict[str, Any]:
    """Load a fine-tuned run, score it on `split`, write `results.json` into the run folder
    (`results_path(run)`)."""
    from gpt1.finetune import load_finetuned
    model, record, tok = load_finetuned(run)
    task = _task_of(record, task_name)
    model = _place(model, device, precision)
    results = evaluate_model(model, task, tok, data, split, record["n_ctx"],
                             record.get("question_delimiter", False), micro, skip_bad_rows)
    write_results(_run_folder(run), results)
    return results


def results_path(run: str | Path) -> Path:
    """Where `evaluate_run` writes: results.json in the run folder (RUN or RUN/final given)."""
    return _run_folder(run) / "results.json"


def predict_run(run: str | Path, task_name: str | None, data: str, split: str = "test",
                out: str | Path | None = None, micro: int = 16, skip_bad_rows: bool = False,
                device: str = "auto", precision: str = "auto") -> list[Path]:
    """Write GLUE-style `index<TAB>prediction` files (one per file the split stands for)."""
    from gpt1.finetune import encode_split, load_finetuned
    model, record, tok = load_finetuned(run)
    task = _task_of(record, task_name)
    model = _place(model, device, precision)
    out_dir = Path(out) if out else _run_folder(run) / "submission"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in task.resolve_splits(split):
        sp = task.read(data, name, skip_bad_rows, need_labels=False)
        enc = encode_split(sp, task, tok, record["n_ctx"], record.get("question_delimiter", False))
        preds = predict_outputs(model, task, enc, micro)
        stem = GLUE_FILES.get(f"{task.name}/{name}", GLUE_FILES.get(task.name, task.name))
        path = out_dir / f"{stem}.tsv"
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("index\tprediction\n")
            for uid, p in zip(enc.uids, preds):
                fh.write(f"{uid}\t{_label_text(task, p)}\n")
        written.append(path)
    return written


def _label_text(task: Task, pred: Any) -> str:
    if task.regression:
        return f"{pred:.3f}"
    if task.kind == "choice":
        if task.name.startswith("race"):
            return "ABCDEFGH"[pred]
        if task.name == "story_cloze":
            return str(pred + 1)  # AnswerRightEnding is 1-based
    return task.labels[pred] if task.labels else str(pred)
