"""Task heads on the hidden state at the extract token, the fine-tuning module and its losses.

`FinetuneModel(gpt, kind, n_outputs)` takes ids `[B, K, T]` (K sequences per example: 1 for
classification/entailment, 2 for similarity, one per choice) and returns the task output and the
per-sequence LM loss, in one forward so that DDP sees every parameter used.

- The extract state is the final hidden state at the FIRST `_classify_` token of each sequence
  (OAI's argmax over `ids == clf`), gathered per sequence.
- Classifier dropout (p = 0.1) uses one mask per example, shape `[B, 1, C]`, shared by all its
  sequences (OAI's noise_shape; PORT issue #11 / PR #22).
- similarity: the two orders' extract states are added, then one linear layer.
- choice: a linear layer to 1 per sequence; the scores `[B, K]` go through softmax over choices.
- regression (STS-B): one output, mean squared error.
Head weights are N(0, 0.02), biases 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.model import GPT
from gpt1.objectives import lm_loss_sequence_mean

KINDS = ("single", "pair", "similarity", "choice")


def extract_states(hidden: torch.Tensor, ids: torch.Tensor, classify_id: int) -> torch.Tensor:
    """hidden `[N, T, C]`, ids `[N, T]` -> the state at each row's first classify token `[N, C]`."""
    is_clf = ids == classify_id
    if not bool(is_clf.any(dim=1).all()):
        raise ValueError("every sequence needs a classify token")
    pos = is_clf.int().argmax(dim=1)                           # first occurrence, [N]
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), pos]


def shared_dropout(h: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout on `[B, K, C]` with one mask per example, broadcast over its K sequences."""
    if not training or p == 0.0:
        return h
    B, _, C = h.shape
    mask = F.dropout(h.new_ones(B, 1, C), p, training=True)    # [B, 1, C], 0 or 1/(1-p)
    return h * mask


class TaskHead(nn.Module):
    """Linear layer(s) on extract states `[B, K, C]` -> logits `[B, n]`, scores `[B, K]` or `[B]`."""

    def __init__(self, n_embd: int, kind: str, n_outputs: int, pdrop: float = 0.1,
                 std: float = 0.02):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown head kind {kind!r}")
        self.kind, self.pdrop, self.n_outputs = kind, pdrop, n_outputs
        self.linear = nn.Linear(n_embd, 1 if kind == "choice" else n_outputs)
        nn.init.normal_(self.linear.weight, std=std)
        nn.init.zeros_(self.linear.bias)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        h = shared_dropout(states, self.pdrop, self.training)   # [B, K, C]
        if self.kind == "choice":
            return self.linear(h).squeeze(-1)                   # [B, K]
        if self.kind == "similarity":
            h = h.sum(dim=1)                                    # both orders added: [B, C]
        else:
            h = h[:, 0]                                         # K == 1: [B, C]
        out = self.linear(h)                                    # [B, n_outputs]
        return out.squeeze(-1) if self.n_outputs == 1 else out


class FinetuneModel(nn.Module):
    """A GPT plus a task head; forward returns (task output, LM loss): the LM loss is the mean
    over the B*K sequences of each one's mean next-token loss (a scalar; None without `with_lm`)."""

    def __init__(self, gpt: GPT, kind: str, n_outputs: int, classify_id: int, pdrop: float = 0.1):
        super().__init__()
        self.gpt = gpt
        self.head = TaskHead(gpt.config.n_embd, kind, n_outputs, pdrop, gpt.config.initializer_range)
        self.classify_id = classify_id

    def forward(self, ids: torch.Tensor, mask: torch.Tensor,
                with_lm: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, K, T = ids.shape
        flat = ids.reshape(B * K, T)                            # [B*K, T]
        # Each row is computed up to its last real token: the padding after it is skipped.
        positions = torch.arange(1, T + 1, device=mask.device, dtype=mask.dtype)
        lengths = (mask.reshape(B * K, T) * positions).amax(dim=1).long()   # [B*K]
        hidden = self.gpt(flat, lengths=lengths)                # [B*K, T, C]
        states = extract_states(hidden, flat, self.classify_id).view(B, K, -1)  # [B, K, C]
        out = self.head(states)
        lm = lm_loss_sequence_mean(self.gpt, hidden, flat, mask.reshape(B * K, T)) if with_lm else None
        return out, lm


def task_loss(output: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    """Mean cross-entropy over classes or choices, or mean squared error for regression."""
    if regression:
        return F.mse_loss(output.float(), labels.float())
    return F.cross_entropy(output.float(), labels.long())


def finetune_loss(output: torch.Tensor, lm: torch.Tensor | None, labels: torch.Tensor,
                  regression: bool, lm_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """task loss + lm_coef * mean per-sequence LM loss (reference a.7); lm_coef 0 drops the LM term.

    `lm` is that mean already (`FinetuneModel`) or the per-sequence losses to average.
    """
    task = task_loss(output, labels, regression)
    logs = {"task_loss": float(task.detach())}
    if lm_coef and lm is not None:
        lm_mean = lm.mean()
        logs["lm_loss"] = float(lm_mean.detach())
        return task + lm_coef * lm_mean, logs
    return task, logs
