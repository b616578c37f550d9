"""Fine-tuned checkpoint folders: a GPT checkpoint plus the task head and the task record.

`gpt1 finetune` writes them (`head.safetensors`, `task.json` beside the model files; the file
names and the task record's reader are `gpt1.checkpoint_files`'); `load_finetuned_model` loads
one back, from a path or from a folder `open_checkpoint` already read.
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
from gpt1.model.heads import FinetuneModel
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
    if record["classify_id"] >= gpt.config.vocab_size or record["n_ctx"] > gpt.config.n_positions:
        raise CheckpointError(
            f"{task_file}: classify_id {record['classify_id']} or n_ctx "
            f"{record['n_ctx']} does not fit the model (vocab_size "
            f"{gpt.config.vocab_size}, n_positions {gpt.config.n_positions})"
        )
    model = FinetuneModel(
        gpt,
        record["kind"],
        record["n_outputs"],
        record["classify_id"],
        record.get("clf_pdrop", 0.1),
    )
    model.head.load_state_dict(load_state_dict(checkpoint.folder / HEAD_FILE, expect=model.head))
    return model.to(device).eval()


def finetuned_record(checkpoint: CheckpointFolder) -> dict[str, Any]:
    """The task record of a fine-tuned checkpoint; any other checkpoint is an error."""
    if not checkpoint.finetuned:
        raise CheckpointError(
            f"{checkpoint.folder}: not a fine-tuned checkpoint (no {TASK_FILE}); "
            "run `gpt1 finetune` first"
        )
    return checkpoint.task
