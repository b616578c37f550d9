"""`gpt1 convert RUN OUT.onnx --to onnx`: the LM or a fine-tuned classifier as one ONNX graph.

- A pretrained checkpoint exports the language model: `input_ids` int64 `[batch, sequence]` ->
  `logits` float32 `[batch, sequence, vocab]`.
- A fine-tuned checkpoint exports the task model: `input_ids` int64 `[batch, sequences,
  sequence]` (the task's input layout: 1 sequence for classification and entailment, 2 for
  similarity, one per answer for multiple choice) -> `output`: logits `[batch, n_outputs]`,
  scores `[batch, choices]`, or `[batch]` for one output. The head reads the state at each
  sequence's first `_classify_` token (right padding after it changes nothing).
Batch and sequence axes (and the number of choices) are dynamic. The graph carries the task
record and the trained window as metadata (`gpt1_task`, `gpt1_window`).

Exporter: torch.onnx.export with dynamo=True (torch.export + onnxscript, the maintained path;
it runs offline). The TorchScript exporter (dynamo=False) is deprecated in torch 2.x.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from gpt1.checkpoint_files import resolve_checkpoint_dir, trained_context
from gpt1.errors import ConfigError
from gpt1.extras import require
from gpt1.files import remove, sigterm_raises, writing
from gpt1.model.finetuned import read_task_head
from gpt1.model.gpt import GPT
from gpt1.model.heads import TaskHead
from gpt1.tasks.kinds import KINDS

OPSET = 18


class LanguageModel(nn.Module):
    """ids `[B, T]` -> next-token logits `[B, T, vocab]`."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.gpt.lm_logits(self.gpt(input_ids))


class TaskModel(nn.Module):
    """ids `[B, K, T]` -> the task head's output, as `gpt1.model.heads.FinetuneModel` in eval mode."""

    def __init__(self, gpt: GPT, head: TaskHead, classify_id: int):
        super().__init__()
        self.gpt, self.head, self.classify_id = gpt, head, classify_id

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        B, K, T = input_ids.shape
        flat = input_ids.reshape(B * K, T)  # [B*K, T]
        hidden = self.gpt(flat)  # [B*K, T, C]
        pos = (flat == self.classify_id).to(torch.int32).argmax(dim=1)  # first _classify_
        states = hidden[torch.arange(B * K), pos]  # [B*K, C]
        return self.head(states.reshape(B, K, -1))


# The exporter logs that torchvision's operators are not registered (we have none), and its graph
# optimizer (onnxscript, onnx_ir) logs every pass and every initializer it merges, tens of lines
# at INFO: noise for the user of `convert`, which prints one line of its own when done.
QUIET_LOGGERS = ("torch.onnx._internal.exporter._registration", "onnxscript", "onnx_ir")


def _export(module: nn.Module, example: torch.Tensor, shapes: dict, output: str):
    quiet = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return torch.onnx.export(
                module,
                (example,),
                dynamo=True,
                dynamic_shapes=shapes,
                input_names=["input_ids"],
                output_names=[output],
                opset_version=OPSET,
                optimize=True,
                verbose=False,
            )
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)


def export_onnx(
    src: str | Path, src_format: str, gpt: GPT, dst: Path, notes: list[str] | None = None
) -> Path:
    """Write `gpt` (with its task head when `src` is a fine-tuned gpt1 checkpoint) to `dst`."""
    require("onnx", "onnx", "onnxscript", what="gpt1 convert --to onnx")
    if dst.suffix != ".onnx":
        raise ConfigError(f"{dst}: --to onnx writes a file; name it *.onnx")
    gpt = gpt.eval()
    folder = resolve_checkpoint_dir(src) if src_format == "gpt1" else None
    record, window = None, trained_context(folder) if folder is not None else None
    if folder is not None and (folder / "task.json").is_file():
        record, state = read_task_head(folder, gpt.config)
        head = TaskHead(gpt.config.n_embd, record["kind"], record["n_outputs"])
        head.load_state_dict(state)
        module: nn.Module = TaskModel(gpt, head.eval(), record["classify_id"]).eval()
        window = record.get("n_ctx") or window
        sequences = KINDS[record["kind"]].sequences  # None: one per answer, dynamic
        example = torch.full((2, sequences or 3, 5), record["classify_id"], dtype=torch.long)
        seq = torch.export.Dim("sequence", min=2, max=gpt.config.n_positions)
        shapes = {
            "input_ids": {
                0: torch.export.Dim("batch", min=1),
                **({} if sequences else {1: torch.export.Dim("choices", min=2)}),
                2: seq,
            }
        }
        what = f"the {record['kind']} task model (input_ids [batch, sequences, sequence] -> output)"
    else:
        module = LanguageModel(gpt).eval()
        example = torch.zeros((2, 5), dtype=torch.long)
        shapes = {
            "input_ids": {
                0: torch.export.Dim("batch", min=1),
                1: torch.export.Dim("sequence", min=2, max=gpt.config.n_positions),
            }
        }
        what = "the language model (input_ids [batch, sequence] -> logits)"
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    # The temporary is created before the export (seconds to minutes), so that a folder that
    # cannot be written is one line at once, not an exporter's traceback at the end.
    with writing(dst, cleanup=tmp):
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(b"")
    with sigterm_raises(), contextlib.ExitStack() as cleanup:
        # Best effort: on a read-only disk even a missing file's unlink fails.
        cleanup.callback(remove, tmp)
        program = _export(module, example, shapes, "output" if record else "logits")
        meta = {"gpt1_window": str(window or gpt.config.n_positions)}
        if record is not None:
            meta["gpt1_task"] = json.dumps(record)
        program.model.metadata_props.update(meta)
        with writing(dst, cleanup=tmp):
            program.save(str(tmp))
            os.replace(tmp, dst)
    if notes is not None:
        trained = f"; trained on windows of {window}" if window else ""
        notes.append(
            f"onnx: {what}; dynamic batch and sequence axes (sequence up to "
            f"n_positions={gpt.config.n_positions}{trained})"
        )
    return dst
