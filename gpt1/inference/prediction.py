"""A fine-tuned model's predictions on encoded examples, and how a prediction is written.

`predict_raw` gives the head's outputs per example (what `gpt1 predict --format jsonl` turns into
probabilities and `gpt1 serve`'s /v1/predict returns), `predict_outputs` the predicted class,
choice or score, and `label_text` the label `gpt1 predict` writes for one.
"""

from __future__ import annotations

from typing import Any

import torch

from gpt1 import threads
from gpt1.errors import Gpt1Error
from gpt1.tasks.batches import example_length, make_batch
from gpt1.tasks.registry import Task


@torch.no_grad()
def predict_raw(model: Any, task: Task, enc: Any, micro: int) -> list[Any]:
    """The head's output per example, in order: class logits or choice scores (a list of
    floats each), or a float score for regression tasks.

    Batches are formed longest first, so each pads to a similar length (right padding does not
    reach a causal model's real positions, so an example's output does not depend on its
    batch); the outputs are put back in the split's order.
    """
    device = next(model.parameters()).device
    order = sorted(range(len(enc.items)), key=lambda i: -example_length(enc.items[i]))
    outputs: list[Any] = [None] * len(order)
    for start in range(0, len(order), micro):
        index = order[start : start + micro]
        batch = make_batch(enc, index, task.regression)
        out, _ = model(batch["ids"].to(device), batch["mask"].to(device), with_lm=False)
        out = out.float().cpu()
        if not bool(torch.isfinite(out).all()):  # argmax of NaN rows would pick class 0 silently
            raise Gpt1Error(
                "the model produced NaN or infinite outputs (overflow or damaged "
                "weights); predictions would be meaningless"
            )
        for i, row in zip(index, out.tolist()):
            outputs[i] = row
        threads.adapt()
    return outputs


def predict_outputs(model: Any, task: Task, enc: Any, micro: int) -> list[Any]:
    """Predicted class index (or choice index, or score) per example, in order."""
    outputs = predict_raw(model, task, enc, micro)
    if task.regression or not outputs:
        return outputs
    return torch.tensor(outputs).argmax(-1).tolist()


def label_text(task: Task, pred: Any) -> str:
    """What `gpt1 predict` writes for prediction `pred` (a class, choice index or score)."""
    if task.regression:
        return f"{pred:.3f}"
    if task.is_choice:
        if task.name.startswith("race"):
            return "ABCDEFGH"[pred]
        if task.name == "story_cloze":
            return str(pred + 1)  # AnswerRightEnding is 1-based
    return task.labels[pred] if task.labels else str(pred)
