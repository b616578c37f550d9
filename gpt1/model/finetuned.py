"""Fine-tuned checkpoint folders: a GPT checkpoint plus the task head and the task record.

`gpt1 finetune` writes them (`head.safetensors`, `task.json` beside the model files; the file
names and the task record's reader are `gpt1.checkpoint_files`'); `load_finetuned_model` loads
one back from a folder `open_checkpoint` read. `read_task_head` is the one
reader of the record and the head's weights, checked against the body: inference and the
exporters (`convert --to hf|onnx`) take them from it.
"""

from __future__ import annotations

from typing import Any

import torch

from gpt1.checkpoint_files import (
    HEAD_FILE,
    TASK_FILE,
    AnyCheckpoint,
    CheckpointFolder,
    load_state_dict,
    open_checkpoint,
)
from gpt1.errors import CheckpointError
from gpt1.model.checkpoint import load_model
from gpt1.model.heads import FinetuneModel, TaskHead


def load_finetuned_model(
    checkpoint: CheckpointFolder, device: str | torch.device = "cpu"
) -> FinetuneModel:
    """The model (body and head, in eval mode, on `device`) of an opened fine-tuned checkpoint
    folder; its task record is the folder's `task`. The body loads through `load_model`, whose
    one memory check counts the head too."""
    n_outputs = finetuned_record(checkpoint)["n_outputs"]
    body = load_model(checkpoint, device, head_outputs=n_outputs)
    record = fitting_record(checkpoint, body.config)
    model = FinetuneModel(
        body, record["kind"], n_outputs, record["classify_id"], record.get("clf_pdrop", 0.1)
    )
    model.head.load_state_dict(load_state_dict(checkpoint.folder / HEAD_FILE, expect=model.head))
    return model.to(device).eval()


def read_task_head(
    run: AnyCheckpoint, config: Any
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A fine-tuned checkpoint's task record (`fitting_record`) and its head's tensors, each
    present with the shape and a type `TaskHead` takes."""
    checkpoint = open_checkpoint(run)
    record = fitting_record(checkpoint, config)
    with torch.device("meta"):  # shapes and types only: nothing allocated
        expect = TaskHead(config.n_embd, record["kind"], record["n_outputs"])
    return record, load_state_dict(checkpoint.folder / HEAD_FILE, expect=expect)


def fitting_record(checkpoint: CheckpointFolder, config: Any) -> dict[str, Any]:
    """The task record (validated task.json) of an opened fine-tuned checkpoint, fitting the
    body's `config` (a `ModelConfig`, or the LSTM's): classify_id a row of its token table,
    n_ctx within its positions."""
    record = finetuned_record(checkpoint)
    if record["classify_id"] >= config.vocab_size or record["n_ctx"] > config.n_positions:
        raise CheckpointError(
            f"{checkpoint.folder / TASK_FILE}: classify_id {record['classify_id']} or n_ctx "
            f"{record['n_ctx']} does not fit the model (vocab_size "
            f"{config.vocab_size}, n_positions {config.n_positions})"
        )
    return record


def finetuned_record(checkpoint: CheckpointFolder) -> dict[str, Any]:
    """The task record of a fine-tuned checkpoint; any other checkpoint is an error."""
    if not checkpoint.finetuned:
        raise CheckpointError(
            f"{checkpoint.folder}: not a fine-tuned checkpoint (no {TASK_FILE}); "
            "run `gpt1 finetune` first"
        )
    return checkpoint.task
