"""Fine-tuned checkpoint folders: a GPT checkpoint plus the task head and the task record.

`gpt1 finetune` writes them (`head.safetensors`, `task.json` beside the model files; the file
names and the task record's reader are `gpt1.checkpoint_files`'); `load_finetuned_model` loads
one back, from a path or from a folder `open_checkpoint` already read. `read_task_head` is the one
reader of the record and the head's weights, checked against the body: inference and the
exporters (`convert --to hf|onnx`) take them from it.
"""

from __future__ import annotations

from typing import Any

import torch

from gpt1.checkpoint_files import (  # noqa: F401 (HEAD_FILE, TASK_FILE re-exported)
    HEAD_FILE,
    TASK_FILE,
    AnyCheckpoint,
    CheckpointFolder,
    load_state_dict,
)
from gpt1.errors import CheckpointError
from gpt1.model.checkpoint import opened, read_model_config
from gpt1.model.heads import FinetuneModel, TaskHead
from gpt1.model.memory import ensure_model_fits
from gpt1.model.registry import load_any_checkpoint


def load_finetuned_model(run: AnyCheckpoint, device: str | torch.device = "cpu") -> FinetuneModel:
    """The model (body and head, in eval mode, on `device`) of a fine-tuned run or checkpoint
    folder; its task record is the opened folder's `task`."""
    checkpoint = opened(run)
    record, task_file = finetuned_record(checkpoint), checkpoint.folder / TASK_FILE
    if checkpoint.arch == "gpt":
        config = read_model_config(checkpoint)
        ensure_model_fits(
            config,
            str(task_file),
            device,
            extra_params=(config.n_embd + 1) * record["n_outputs"],
        )
    gpt = load_any_checkpoint(checkpoint, device)
    record, head = read_task_head(checkpoint, gpt.config)
    model = FinetuneModel(
        gpt,
        record["kind"],
        record["n_outputs"],
        record["classify_id"],
        record.get("clf_pdrop", 0.1),
    )
    model.head.load_state_dict(head)
    return model.to(device).eval()


def read_task_head(
    run: AnyCheckpoint, config: Any
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A fine-tuned checkpoint's task record (validated task.json) and its head's tensors, each
    present with the shape and a type `TaskHead` takes, the record fitting the body's `config`
    (a `ModelConfig`, or the LSTM's: classify_id a row of its table, n_ctx within it)."""
    checkpoint = opened(run)
    record, task_file = finetuned_record(checkpoint), checkpoint.folder / TASK_FILE
    if record["classify_id"] >= config.vocab_size or record["n_ctx"] > config.n_positions:
        raise CheckpointError(
            f"{task_file}: classify_id {record['classify_id']} or n_ctx "
            f"{record['n_ctx']} does not fit the model (vocab_size "
            f"{config.vocab_size}, n_positions {config.n_positions})"
        )
    with torch.device("meta"):  # shapes and types only: nothing allocated
        expect = TaskHead(config.n_embd, record["kind"], record["n_outputs"])
    return record, load_state_dict(checkpoint.folder / HEAD_FILE, expect=expect)


def finetuned_record(checkpoint: CheckpointFolder) -> dict[str, Any]:
    """The task record of a fine-tuned checkpoint; any other checkpoint is an error."""
    if not checkpoint.finetuned:
        raise CheckpointError(
            f"{checkpoint.folder}: not a fine-tuned checkpoint (no {TASK_FILE}); "
            "run `gpt1 finetune` first"
        )
    return checkpoint.task
