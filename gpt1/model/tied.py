"""What GPT and the LSTM baseline share: a language model whose output layer is its token table.

`TiedLM` defines, once, the calls of the `gpt1.model.registry.LanguageModel` protocol that do not
depend on the architecture: `forward` (ids -> hidden states, `at=` positions, the tied weight with
`with_head_weight=True`), `lm_weight`, `lm_logits`, `add_tokens` and `num_parameters`. A subclass
sets `config` (with `vocab_size` and `initializer_range`) and `wte`, and computes its states in
`hidden_states`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class LMOutput(NamedTuple):
    """What a forward pass gives the language-model head: the hidden states and the tied output
    weight to use with them (the token table this pass embedded with, dropout included)."""

    hidden: torch.Tensor  # [B, T, n_embd]
    head_weight: torch.Tensor  # [vocab_size, n_embd]


class TiedLM(nn.Module):
    """A language model whose output layer is its token table `wte` (module doc)."""

    config: Any
    wte: nn.Embedding

    def forward(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor | None = None,
        *,
        at: torch.Tensor | None = None,
        with_head_weight: bool = False,
    ) -> torch.Tensor | LMOutput:
        """ids `[B, T]` (int64) -> final hidden states `[B, T, n_embd]`.

        With `lengths` `[B]`, row b is right-padded after its first `lengths[b]` tokens (a model
        may skip the padding; the real positions' states never depend on it).
        With `at` `[B]` (one position per row), returns only the final hidden state at `at[b]`
        of each row, `[B, n_embd]`: what a classification head reads.
        With `with_head_weight`, returns `LMOutput(hidden, head_weight)`: what a training loss
        needs for the tied output layer.
        """
        if at is not None and with_head_weight:
            raise ValueError("at returns states at one position per row, no head weight")
        hidden, head_weight = self.hidden_states(ids, lengths, at)
        return LMOutput(hidden, head_weight) if with_head_weight else hidden

    def hidden_states(
        self, ids: torch.Tensor, lengths: torch.Tensor | None, at: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s states (all positions, or those `at`) and the token table the pass
        embedded with; each architecture computes them its own way."""
        raise NotImplementedError

    def lm_weight(self) -> torch.Tensor:
        """The output layer's weight `[vocab_size, n_embd]`: the token table (for a training pass
        with dropout on the table, use `forward(..., with_head_weight=True)` instead)."""
        return self.wte.weight

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Tied-head logits: hidden `[..., n_embd]` -> `[..., vocab_size]`."""
        return F.linear(hidden, self.lm_weight())

    @torch.no_grad()
    def add_tokens(self, n: int, generator: torch.Generator | None = None) -> list[int]:
        """Append `n` token rows drawn from N(0, initializer_range); return their ids.

        These are the paper's start / delimiter / extract tokens; the tied output layer covers
        them automatically because it is the token table itself.
        """
        if n <= 0:
            return []
        old = self.wte.weight
        rows = torch.randn(n, old.shape[1], generator=generator, dtype=torch.float32)
        rows = (rows * self.config.initializer_range).to(device=old.device, dtype=old.dtype)
        table = nn.Embedding(old.shape[0] + n, old.shape[1], device=old.device, dtype=old.dtype)
        table.weight.copy_(torch.cat([old, rows], dim=0))  # [V + n, C]
        self.wte = table
        first = self.config.vocab_size
        # A new config for this model only: configs are frozen, and the one it was built from may
        # be shared (a pretrained model and a fresh copy made from its config).
        self.config = dataclasses.replace(self.config, vocab_size=first + n)
        return list(range(first, first + n))

    def embedding_tables(self) -> tuple[nn.Embedding, ...]:
        """The tables `num_parameters(exclude_embeddings=True)` leaves out."""
        return (self.wte,)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameter count; with `exclude_embeddings`, without the embedding tables."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= sum(table.weight.numel() for table in self.embedding_tables())
        return total
