"""`gpt1 evaluate` and `gpt1 predict`: score a fine-tuned run on a split, write submissions.

`gpt1 finetune` writes the scores of its evaluation split to `RUN/results.json`; `gpt1 evaluate`
writes `RUN/results.<split>.json`: {"task", "split", "n", metric: value, ...}. When a split stands
for several files (MNLI's matched and mismatched dev sets) the first one's metrics are the
top-level entries and each file also has its own entry. A split is a name found in the data
folder (`dev`, `held_out`, ...) or a file given by path, which is a split named after its stem
(`source`). `gpt1 predict` writes `index<TAB>prediction` files named by `submission_name`, or
JSONL/CSV records with inputs and probabilities (`gpt1.recipes.predictions`). Both take their
settings as one `ScoringOptions`; neither replaces an existing file unless told `--overwrite`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpt1.checkpoint_files import (
    AnyCheckpoint,
    CheckpointFolder,
    open_checkpoint,
    resolve_checkpoint_dir,
)
from gpt1.errors import ConfigError, DataError
from gpt1.files import check_output, folder_files, write_json, write_text
from gpt1.inference.loading import load_for_inference, task_of
from gpt1.inference.prediction import label_text, predict_outputs, predict_raw
from gpt1.model.finetuned import finetuned_record, load_finetuned_model
from gpt1.recipes import predictions
from gpt1.tasks.batches import encode_split, report_skipped
from gpt1.tasks.metrics import compute
from gpt1.tasks.registry import Task, check_split_name


def score(model: Any, task: Task, enc: Any, micro: int) -> dict[str, float]:
    """The task's metrics on an encoded labelled split, plus `n`."""
    preds = predict_outputs(model, task, enc, micro)
    return {"n": len(preds), **compute(task.metrics, preds, enc.labels, task.positive_index)}


@dataclass(frozen=True)
class ScoringOptions:
    """What `gpt1 evaluate` and `gpt1 predict` score and how, each the flag of its name: the
    fine-tuned `run`, the `task` it must have been trained on (None: its own), the folder `data`
    with `split` or one `file` instead (`source`), then `micro_batch` (examples per forward pass),
    `device`, `precision`, `skip_bad_rows`, `overwrite` and `out` (None: in the run folder)."""

    run: str | Path
    task: str | None = None
    data: str | None = None
    file: str | Path | None = None
    split: str | None = None
    micro_batch: int = 16
    device: str = "auto"
    precision: str = "auto"
    skip_bad_rows: bool = False
    overwrite: bool = False
    out: str | Path | None = None

    def __post_init__(self) -> None:
        if self.micro_batch < 1:
            raise ConfigError(f"--micro-batch must be >= 1, got {self.micro_batch}")


def evaluate_model(
    model: Any, task: Task, tok: Any, record: dict[str, Any], options: ScoringOptions
) -> dict[str, Any]:
    """Metrics of `model` (whose task record, task.json, gives its context and delimiter) on
    `options.split` of `options.data` (all files the split stands for; with `options.file`, the
    file `data` alone), with the name of the headline metric (the first, the one to compare runs
    by) and of the class F1 is computed for."""
    data, split, micro = options.data, options.split, options.micro_batch
    results: dict[str, Any] = {"task": task.name, "split": split, "headline": task.metrics[0]}
    if task.f1_label is not None:
        results["f1_label"] = task.f1_label
    n_ctx, question_delimiter = record["n_ctx"], record.get("question_delimiter", False)
    names = (split,) if options.file is not None else task.resolve_splits(split)
    for i, name in enumerate(names):
        sp = task.read(data, name, options.skip_bad_rows, need_labels=True)
        report_skipped(sp)
        metrics = score(model, task, encode_split(sp, task, tok, n_ctx, question_delimiter), micro)
        metrics["skipped"] = len(sp.skipped)
        if i == 0:
            results.update(metrics)
        if len(names) > 1:
            results[name] = metrics
    return results


def write_results(
    run: str | Path, results: dict[str, Any], name: str = "results.json", overwrite: bool = True
) -> Path:
    """Write `results` as RUN/`name` atomically (refusing an existing file unless `overwrite`)."""
    path = Path(run) / name
    check_output(path, overwrite)
    return write_json(path, results)


def results_name(split: str) -> str:
    """The file `gpt1 evaluate` writes for `split` (`results.json` is fine-tuning's own)."""
    return f"results.{split}.json"


def submission_name(task: Task, split_file: str, fmt: str = "tsv") -> str:
    """`gpt1 predict`'s file for one split file: in TSV, GLUE's submission name for test splits
    (`SST-2.tsv`, `MNLI-m.tsv`), the name plus the split otherwise (`SST-2.dev.tsv`); in JSONL or
    CSV the split's name (`held_out.jsonl`, `test_matched.csv`)."""
    if fmt != "tsv":
        return f"{split_file}.{fmt}"
    names = task.submission or {}
    stem = names.get(split_file, task.name) if isinstance(names, dict) else names
    return f"{stem}.tsv" if split_file.startswith("test") else f"{stem}.{split_file}.tsv"


def source(options: ScoringOptions, default: str) -> ScoringOptions:
    """`options` with the data and split to read: `data` with `split` (default `default`), or
    `file` as the data, a split named after its stem (`held_out.csv` -> `held_out`) unless
    `split` names it."""
    data, split, file = options.data, options.split, options.file
    if file is None:
        if not data:
            raise ConfigError("give --data DIR (the task's files, with --split) or --file PATH")
        return replace(options, split=split or default)
    if data:
        raise ConfigError("give either --data (with --split) or --file, not both")
    path = Path(file)
    if not path.is_file():
        raise DataError("no such file", path)
    name = split or path.stem
    try:
        check_split_name(name)
    except ConfigError:
        raise ConfigError(
            f"--file {file}: its stem {name!r} cannot name a split; add --split NAME"
        ) from None
    return replace(options, data=str(path), split=name)


def load_finetuned(run: AnyCheckpoint) -> tuple[Any, dict[str, Any], Any]:
    """(model, task record, tokenizer) of a fine-tuned run or checkpoint folder, as trained: on
    the CPU in float32, not prepared for inference (the analyses and fine-tuning's own scoring
    use it; the commands load with `gpt1.inference.loading.load_for_inference`)."""
    from gpt1.text.tokenizer import Tokenizer  # deferred: spaCy and ftfy load with it

    checkpoint = open_checkpoint(run)
    model = load_finetuned_model(checkpoint)
    return model, checkpoint.task, Tokenizer.from_dir(checkpoint.folder)


def _run_folder(run: str | Path, folder: Path) -> Path:
    """The run folder that holds the fine-tuned checkpoint `folder` (RUN or RUN/final given)."""
    return folder.parent if Path(run).resolve() != folder.resolve() else folder


def open_finetuned(run: str | Path, task_name: str | None) -> tuple[CheckpointFolder, Task]:
    """A fine-tuned run's folder, opened, and its task (which `task_name`, if given, must name):
    what evaluate and predict refuse before any work."""
    checkpoint = open_checkpoint(run)
    return checkpoint, task_of(finetuned_record(checkpoint), task_name)


def evaluate_run(options: ScoringOptions) -> dict[str, Any]:
    """Load a fine-tuned run, score it on `split` (default dev; or on `file`: `source`), write
    `results.<split>.json` into `out` (default: the run folder; an existing file only with
    `overwrite`; `results_path`)."""
    options = source(options, "dev")
    data, name, overwrite = options.data, results_name(options.split), options.overwrite
    checkpoint, task = open_finetuned(options.run, options.task)
    out_dir = Path(options.out or _run_folder(options.run, checkpoint.folder))
    check_output(out_dir / name, overwrite, run_inputs(checkpoint.folder, data), (data,))
    loaded = load_for_inference(checkpoint, options.device, options.precision)
    results = evaluate_model(loaded.model, task, loaded.tokenizer, loaded.record, options)
    write_results(out_dir, results, name, overwrite)
    return results


def run_inputs(folder: Path, data: str | Path) -> list[Path]:
    """What evaluate and predict read: the fine-tuned checkpoint folder's files and the task
    data's (its folder is a root for `gpt1.files.check_inputs`)."""
    return [*folder_files(folder), *folder_files(data)]


def results_path(run: str | Path, split: str, out: str | Path | None = None) -> Path:
    """Where `evaluate_run` writes: results.<split>.json in `out` or the run folder (RUN or
    RUN/final given)."""
    if out:
        return Path(out) / results_name(split)
    return _run_folder(run, resolve_checkpoint_dir(run)) / results_name(split)


def predict_run(options: ScoringOptions, fmt: str = "tsv", raw_csv: bool = False) -> list[Path]:
    """Write one file per file the split (default test) stands for (or for `file`: `source`),
    named by `submission_name`: GLUE-style `index<TAB>prediction` (`fmt` tsv, into
    RUN/submission) or records with inputs and probabilities (jsonl, csv, into RUN/predictions);
    an existing file is replaced only with `overwrite`; `raw_csv` keeps CSV cells that look like
    formulas as they are (`predictions.neutralised`)."""
    if fmt not in predictions.FORMATS:
        raise ConfigError(f"--format {fmt}: choose one of {', '.join(predictions.FORMATS)}")
    options = source(options, "test")
    data, split, run, overwrite = options.data, options.split, options.run, options.overwrite
    checkpoint, task = open_finetuned(run, options.task)
    default_dir = "submission" if fmt == "tsv" else "predictions"
    out_dir = Path(options.out or _run_folder(run, checkpoint.folder) / default_dir)
    names = (split,) if options.file is not None else task.resolve_splits(split)
    inputs = run_inputs(checkpoint.folder, data)
    for name in names:  # refuse before any work, not after the first file
        check_output(out_dir / submission_name(task, name, fmt), overwrite, inputs, (data,))
    loaded = load_for_inference(checkpoint, options.device, options.precision)
    model, tok, record = loaded.model, loaded.tokenizer, loaded.record
    written = []
    for name in names:
        sp = task.read(data, name, options.skip_bad_rows, need_labels=False)
        enc = encode_split(sp, task, tok, record["n_ctx"], record.get("question_delimiter", False))
        text = _prediction_text(model, task, sp.examples, enc, options.micro_batch, fmt, raw_csv)
        written.append(write_text(out_dir / submission_name(task, name, fmt), text))
    return written


def _prediction_text(
    model: Any, task: Task, examples: list, enc: Any, micro: int, fmt: str, raw_csv: bool = False
) -> str:
    """The contents of one prediction file in `fmt`."""
    if fmt == "tsv":
        preds = predict_outputs(model, task, enc, micro)
        rows = [f"{uid}\t{label_text(task, p)}\n" for uid, p in zip(enc.uids, preds)]
        return "index\tprediction\n" + "".join(rows)
    recs = predictions.records(task, examples, predict_raw(model, task, enc, micro))
    return predictions.to_jsonl(recs) if fmt == "jsonl" else predictions.to_csv(recs, raw_csv)
