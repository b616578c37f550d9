"""Loading a checkpoint for inference, the one way every inference command does it.

`load_for_inference(path, device, precision)` opens the checkpoint folder once
(`gpt1.checkpoint_files.open_checkpoint`: the folder a run resolves to, config.json, the
architecture, tokenizer files and a fine-tuned run's task record), loads the model the folder
holds (`gpt1.model.finetuned.load_finetuned_model` for a fine-tuned run, else
`gpt1.model.checkpoint.load_model`: GPT or the LSTM baseline), makes it ready
(`gpt1.inference.prepared.for_inference`), then reads its tokenizer and task. The result is one
`Loaded` value. `gpt1 serve`, `sample`, `evaluate`, `predict`, `zeroshot` and `lm-eval` all load
this way, so a checkpoint, a `--device` and a `--precision` mean the same thing in each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpt1.checkpoint_files import AnyCheckpoint, CheckpointFolder, open_checkpoint
from gpt1.devices import resolve_device, resolve_precision
from gpt1.errors import ConfigError
from gpt1.inference.prepared import for_inference
from gpt1.model.checkpoint import load_model
from gpt1.model.finetuned import load_finetuned_model
from gpt1.tasks.registry import Task, get_task


@dataclass(frozen=True)
class Loaded:
    """A checkpoint loaded for inference: model, tokenizer, task and what its folder says."""

    model: nn.Module  # ready for inference: a fine-tuned run's FinetuneModel, else the LM
    lm: nn.Module  # the language model: `model` itself, or a fine-tuned model's body
    tokenizer: Any | None  # gpt1.text.tokenizer.Tokenizer; None when the folder has none
    task: Task | None  # the task a fine-tuned run was trained on; None for a language model
    record: dict[str, Any] | None  # a fine-tuned run's task record (task.json); else None
    window: int  # positions the LM reads at most: its pretraining window where run.json says
    checkpoint: CheckpointFolder  # the folder, opened once
    device: torch.device
    precision: str  # resolved: fp32, bf16, fp16 or int8


def load_for_inference(
    path: AnyCheckpoint,
    device: str | torch.device = "auto",
    precision: str = "auto",
    tokenizer: str | Path | None = None,
) -> Loaded:
    """The checkpoint at `path` (a checkpoint or run folder, or a folder `open_checkpoint`
    opened) on `device` in `precision` (both may be "auto": `gpt1.devices`), with its tokenizer
    (or the vocabulary folder `tokenizer`) and, for a fine-tuned run, its task."""
    checkpoint = open_checkpoint(path)
    where = device if isinstance(device, torch.device) else resolve_device(device)
    resolved = resolve_precision(precision, where)
    # Weights first: a damaged or oversized checkpoint is refused before the tokenizer loads.
    if checkpoint.finetuned:
        model: nn.Module = load_finetuned_model(checkpoint, where)
    else:
        model = load_model(checkpoint, where)
    model = for_inference(model, where, resolved)
    tok = load_tokenizer(checkpoint, tokenizer)
    record = checkpoint.task if checkpoint.finetuned else None
    task = task_of(record) if record is not None else None
    lm = model.gpt if task is not None else model
    n_positions = lm.config.n_positions
    window = min(n_positions, checkpoint.trained_context or n_positions)
    return Loaded(model, lm, tok, task, record, window, checkpoint, where, resolved)


def load_tokenizer(checkpoint: CheckpointFolder, folder: str | Path | None = None) -> Any | None:
    """The tokenizer in `folder`, else the checkpoint's own; None for a language model without
    tokenizer files (a fine-tuned run needs them: their absence is an error naming the files)."""
    found = Path(folder) if folder else checkpoint.tokenizer_dir
    if found is None and not checkpoint.finetuned:
        return None
    from gpt1.text.tokenizer import Tokenizer  # deferred: spaCy and ftfy load with it

    return Tokenizer.from_dir(found or checkpoint.folder)


def task_of(record: dict[str, Any], name: str | None = None) -> Task:
    """The task a fine-tuned run's record names; `name`, when given, must name the same task."""
    try:
        task = get_task(record["task"], record.get("spec") or None)
    except ConfigError as exc:  # the record's task or spec, not a flag, is what is wrong
        raise ConfigError(f"task.json: {exc}") from None
    if name and get_task(name, record.get("spec") or None).name != task.name:
        raise ConfigError(f"this run was fine-tuned on {task.name!r}, not {name!r}")
    if task.n_outputs != record["n_outputs"]:
        # A head of another width would score against the wrong classes without saying so.
        raise ConfigError(
            f"task.json: n_outputs {record['n_outputs']} does not match task "
            f"{task.name!r} ({task.n_outputs} outputs)"
        )
    return task
