"""Task heads on the hidden state at the extract token, and the fine-tuning module.

`FinetuneModel(gpt, kind, n_outputs)` takes ids `[B, K, T]` (K sequences per example: 1 for
classification/entailment, 2 for similarity, one per choice) and returns the task output and what
the auxiliary LM loss needs (`SequenceLM`), in one forward so that DDP sees every parameter used.
The losses themselves are in `gpt1.train.objectives` (`finetune_loss`, `aux_lm_loss`).

- The extract state is the final hidden state at the FIRST `_classify_` token of each sequence
  (OAI's argmax over `ids == clf`), gathered per sequence.
- Classifier dropout (p = 0.1) uses one mask per example, shape `[B, 1, C]`, shared by all its
  sequences (OAI's train.py passes dropout a noise_shape with the sequence axis set to 1).
- similarity: the two orders' extract states are added, then one linear layer.
- choice: a linear layer to 1 per sequence; the scores `[B, K]` go through softmax over choices.
- regression (STS-B): one output, mean squared error.
Head weights are N(0, 0.02), biases 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.config import TASK_KINDS as KINDS
from gpt1.config import TaskKind
from gpt1.model.gpt import GPT


def extract_positions(ids: torch.Tensor, classify_id: int) -> torch.Tensor:
    """ids `[N, T]` -> the position of each row's first classify token `[N]`."""
    is_clf = ids == classify_id
    if not bool(is_clf.any(dim=1).all()):
        raise ValueError("every sequence needs a classify token")
    return is_clf.int().argmax(dim=1)  # first occurrence


def extract_states(hidden: torch.Tensor, ids: torch.Tensor, classify_id: int) -> torch.Tensor:
    """hidden `[N, T, C]`, ids `[N, T]` -> the state at each row's first classify token `[N, C]`."""
    pos = extract_positions(ids, classify_id)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), pos]


def shared_dropout(h: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout on `[B, K, C]` with one mask per example, broadcast over its K sequences."""
    if not training or p == 0.0:
        return h
    B, _, C = h.shape
    mask = F.dropout(h.new_ones(B, 1, C), p, training=True)  # [B, 1, C], 0 or 1/(1-p)
    return h * mask


class TaskHead(nn.Module):
    """Linear layer(s) on extract states `[B, K, C]` -> logits `[B, n]`, scores `[B, K]` or `[B]`."""

    def __init__(
        self, n_embd: int, kind: str, n_outputs: int, pdrop: float = 0.1, std: float = 0.02
    ):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"unknown head kind {kind!r}")
        self.kind, self.pdrop, self.n_outputs = kind, pdrop, n_outputs
        self.linear = nn.Linear(n_embd, 1 if kind == TaskKind.CHOICE else n_outputs)
        nn.init.normal_(self.linear.weight, std=std)
        nn.init.zeros_(self.linear.bias)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        h = shared_dropout(states, self.pdrop, self.training)  # [B, K, C]
        if self.kind == TaskKind.CHOICE:
            return self.linear(h).squeeze(-1)  # [B, K]
        if self.kind == TaskKind.SIMILARITY:
            h = h.sum(dim=1)  # both orders added: [B, C]
        else:
            h = h[:, 0]  # K == 1: [B, C]
        out = self.linear(h)  # [B, n_outputs]
        return out.squeeze(-1) if self.n_outputs == 1 else out


class SequenceLM(NamedTuple):
    """The inputs of the auxiliary LM loss for the B*K sequences of a fine-tuning batch."""

    hidden: torch.Tensor  # [B*K, T, C]
    ids: torch.Tensor  # [B*K, T]
    mask: torch.Tensor  # [B*K, T], 1 = real token
    head_weight: torch.Tensor  # [V, C], the tied output weight of this forward pass


class FinetuneModel(nn.Module):
    """A GPT plus a task head; forward returns (task output, `SequenceLM` or None without
    `with_lm`). `gpt1.train.objectives.aux_lm_loss` turns the latter into the mean over the B*K
    sequences of each one's mean next-token loss."""

    def __init__(self, gpt: GPT, kind: str, n_outputs: int, classify_id: int, pdrop: float = 0.1):
        super().__init__()
        self.gpt = gpt
        self.head = TaskHead(
            gpt.config.n_embd, kind, n_outputs, pdrop, gpt.config.initializer_range
        )
        self.classify_id = classify_id

    def forward(
        self, ids: torch.Tensor, mask: torch.Tensor, with_lm: bool = True
    ) -> tuple[torch.Tensor, SequenceLM | None]:
        B, K, T = ids.shape
        flat = ids.reshape(B * K, T)  # [B*K, T]
        # Each row is computed up to its last real token: the padding after it is skipped.
        positions = torch.arange(1, T + 1, device=mask.device, dtype=mask.dtype)
        lengths = (mask.reshape(B * K, T) * positions).amax(dim=1).long()  # [B*K]
        if not with_lm:  # the head reads one state per sequence: compute only those at the top
            at = extract_positions(flat, self.classify_id)
            states = self.gpt(flat, lengths=lengths, at=at).view(B, K, -1)  # [B, K, C]
            return self.head(states), None
        hidden, head_weight = self.gpt(flat, lengths=lengths, with_head_weight=True)  # [B*K, T, C]
        states = extract_states(hidden, flat, self.classify_id).view(B, K, -1)  # [B, K, C]
        out = self.head(states)
        lm = SequenceLM(hidden, flat, mask.reshape(B * K, T), head_weight) if with_lm else None
        return out, lm
