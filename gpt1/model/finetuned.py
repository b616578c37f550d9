"""Fine-tuned checkpoint folders: a GPT checkpoint plus the task head and the task record.

`gpt1 finetune` writes them (`head.safetensors`, `task.json` beside the model files);
evaluation, prediction, serving and the analyses load them back with `load_finetuned_model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt1.checkpoint_files import load_state_dict, read_config, resolve_checkpoint_dir
from gpt1.config import check_task_record, read_json_file
from gpt1.errors import CheckpointError, ConfigError
from gpt1.model.checkpoint import read_model_config
from gpt1.model.heads import FinetuneModel
from gpt1.model.memory import ensure_model_fits
from gpt1.model.registry import load_any_checkpoint

HEAD_FILE, TASK_FILE = "head.safetensors", "task.json"


def load_finetuned_model(run: str | Path) -> tuple[FinetuneModel, dict[str, Any], Path]:
    """(model, task record, checkpoint folder) of a fine-tuned run or checkpoint folder."""
    folder = resolve_checkpoint_dir(run)
    if not (folder / TASK_FILE).is_file():
        raise CheckpointError(
            f"{folder}: not a fine-tuned checkpoint (no {TASK_FILE}); run `gpt1 finetune` first"
        )
    record = read_task_record(folder)
    config_data = read_config(folder)
    if config_data.get("arch", "gpt") == "gpt":
        config = read_model_config(folder)
        ensure_model_fits(
            config,
            str(folder / TASK_FILE),
            "cpu",
            extra_params=(config.n_embd + 1) * record["n_outputs"],
        )
    gpt = load_any_checkpoint(folder)
    if record["classify_id"] >= gpt.config.vocab_size or record["n_ctx"] > gpt.config.n_positions:
        raise CheckpointError(
            f"{folder / TASK_FILE}: classify_id {record['classify_id']} or n_ctx "
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
    model.head.load_state_dict(load_state_dict(folder / HEAD_FILE))
    return model.eval(), record, folder


def read_task_record(folder: Path) -> dict[str, Any]:
    """The validated `task.json` of a fine-tuned checkpoint folder."""
    file = Path(folder) / TASK_FILE
    record = read_json_file(file, CheckpointError)
    try:
        return check_task_record(record, str(file))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
