"""Every training loss: the pretraining LM loss, the per-sequence LM loss, the fine-tuning loss.

The LM losses take the tied output weight `head` `[V, C]` (a tensor: the one the forward pass
returned with `with_head_weight=True`, which under matrix embedding dropout is the dropped token
table) or a model (its `lm_weight()`, the plain token table). They compute the cross-entropy
through `chunked_cross_entropy` (`gpt1.train.chunked_ce`), which never holds all
`[tokens, vocab]` logits at once; `lm_loss_per_sequence` is the plain formula it is tested
against.

The softmax covers the token table only (HF convention; OAI's joint matrix also covered position
rows, reference d.1.10).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from gpt1.train.chunked_ce import chunked_cross_entropy

if TYPE_CHECKING:
    from gpt1.model.heads import SequenceLM


def _weight(head: Any) -> torch.Tensor:
    """The output weight `[V, C]`: `head` itself if a tensor, else the model's `lm_weight()`."""
    return head if isinstance(head, torch.Tensor) else head.lm_weight()


def _real_targets(hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor):
    """The positions whose next token is real (`mask` `[B, T]`, 1 = real): their hidden states
    `[N, C]`, those next tokens `[N]` and each one's sequence index `[N]`.

    Selecting them (instead of weighting pads by 0) keeps the output layer off the padding,
    which in fine-tuning batches can be most of the positions.
    """
    B, T, _ = hidden.shape
    real = mask[:, 1:] > 0  # [B, T-1]
    seq = torch.arange(B, device=hidden.device).unsqueeze(1).expand(B, T - 1)[real]
    return hidden[:, :-1][real], ids[:, 1:][real], seq


def lm_loss(
    head: Any,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor | None = None,
    chunk: int = 4096,
) -> torch.Tensor:
    """Mean next-token cross-entropy: hidden `[B, T, C]` at t predicts ids[:, t + 1].

    `mask` `[B, T]` (1 = real token) drops padded targets; the mean is over real targets.
    """
    B, T, C = hidden.shape
    if mask is None:
        h, y = hidden[:, :-1].reshape(B * (T - 1), C), ids[:, 1:].reshape(-1)  # [N, C], [N]
    else:
        h, y, _ = _real_targets(hidden, ids, mask)
    w = torch.full(y.shape, 1.0 / max(y.numel(), 1), dtype=torch.float32, device=y.device)
    return chunked_cross_entropy(h, _weight(head), y, w, chunk)


def lm_loss_window(
    head: Any, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """Mean cross-entropy of hidden `[B, T, C]` against explicit next tokens `targets` `[B, T]`."""
    B, T, C = hidden.shape
    y = targets.reshape(-1)  # [B*T]
    w = torch.full(y.shape, 1.0 / y.numel(), dtype=torch.float32, device=y.device)
    return chunked_cross_entropy(hidden.reshape(B * T, C), _weight(head), y, w, chunk)


def lm_loss_per_sequence(
    head: Any, hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-sequence mean LM loss `[B]` over real targets (reference a.7): sum_t CE_t M_{t+1} / sum M_{t+1}.

    The plain formula (full fp32 logits at every position), for per-sequence values and as the
    reference `lm_loss_sequence_mean` is tested against; fine-tuning trains with the latter.
    """
    logits = F.linear(hidden[:, :-1], _weight(head))  # [B, T-1, V]
    ce = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")  # [B, T-1]
    m = mask[:, 1:].to(ce.dtype)
    return (ce * m).sum(1) / m.sum(1).clamp_min(1.0)


def lm_loss_sequence_mean(
    head: Any, hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, chunk: int = 4096
) -> torch.Tensor:
    """`lm_loss_per_sequence(...).mean()` through the chunked loss, on real targets only.

    The mean over S sequences of each one's mean CE is a weighted sum over real targets (weight
    1 / (S n_s) for a target of sequence s with n_s real targets), so no `[B, T, V]` fp32 logits
    are kept and the output layer never sees padding. Scalar; 0 for a batch without real targets.
    """
    h, y, seq = _real_targets(hidden, ids, mask)
    per_seq = torch.bincount(seq, minlength=hidden.shape[0]).clamp_min(1).float()  # [S] n_s
    weights = 1.0 / (per_seq[seq] * hidden.shape[0])  # [N]
    return chunked_cross_entropy(h, _weight(head), y, weights, chunk)


class WindowLMLoss:
    """`loss_fn(model, batch)` for pretraining: batch = (inputs `[B, T]`, targets `[B, T]`)."""

    def __init__(self, chunk: int = 4096):
        self.chunk = chunk

    def __call__(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
        x, y = batch
        hidden, head = model(x, with_head_weight=True)
        loss = lm_loss_window(head, hidden, y, self.chunk)
        return loss, {"tokens": float(y.numel())}


# ------------------------------------------------------------------------------ fine-tuning
def aux_lm_loss(lm: SequenceLM, chunk: int = 4096) -> torch.Tensor:
    """The auxiliary LM loss of a fine-tuning batch (`FinetuneModel`'s `SequenceLM`): the mean over
    its sequences of each one's mean next-token loss (reference a.7), padding excluded."""
    return lm_loss_sequence_mean(lm.head_weight, lm.hidden, lm.ids, lm.mask, chunk)


def task_loss(output: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    """Mean cross-entropy over classes or choices, or mean squared error for regression."""
    if regression:
        return F.mse_loss(output.float(), labels.float())
    return F.cross_entropy(output.float(), labels.long())


def finetune_loss(
    output: torch.Tensor,
    lm: SequenceLM | torch.Tensor | None,
    labels: torch.Tensor,
    regression: bool,
    lm_coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """task loss + lm_coef * mean per-sequence LM loss (reference a.7); lm_coef 0 drops the LM term.

    `lm` is `FinetuneModel`'s `SequenceLM` (the loss is computed here, `aux_lm_loss`), or LM
    losses already computed (a mean or per-sequence values, averaged), or None.
    """
    task = task_loss(output, labels, regression)
    logs = {"task_loss": float(task.detach())}
    if lm_coef and lm is not None:
        lm_mean = (lm if isinstance(lm, torch.Tensor) else aux_lm_loss(lm)).mean()
        logs["lm_loss"] = float(lm_mean.detach())
        return task + lm_coef * lm_mean, logs
    return task, logs
