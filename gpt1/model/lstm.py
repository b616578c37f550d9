"""The paper's LSTM baseline (Table 5, last row), with the same interface as `gpt1.GPT`.

The paper compares its Transformer with a single-layer 2048-unit LSTM pretrained and fine-tuned in
the same framework. `LSTMLM` is a drop-in for `GPT`: `model(ids [B, T]) -> hidden [B, T, n_embd]`,
`lm_logits(hidden)` tied to the token table, `lm_weight()`, `add_tokens(n)`, `num_parameters()`,
`flops_per_token()`, `.config` and `.wte` (the `gpt1.model.registry.LanguageModel` protocol; all
but its states and FLOPs are `gpt1.model.tied.TiedLM`'s, which both models are). So
pretraining, fine-tuning, zero-shot scoring and checkpoints need no LSTM-specific code; only
building and loading have to know which class to make, which `gpt1.model.registry` does (from the
`"arch"` key of `config.json` when loading).

Layout: token table (n_embd) -> dropout -> single-layer unidirectional LSTM (hidden_size units;
causal by construction) -> linear projection back to n_embd -> dropout. The projection lets the
task heads and the tied output layer see n_embd-wide states whatever the LSTM width.

Sizing rule ("scaled to the model size"): `lstm_config_for(model_config)` chooses `hidden_size` so
that the LSTM's non-embedding parameters (4H(E+H) + 8H for the cell, H*E + E for the projection)
match the Transformer's blocks as closely as possible, rounded to a multiple of 64. The token table
is the same size in both, so total counts then match too (the LSTM has no position table). For
GPT-1's own 117M preset this gives about 4,160 units: the paper's 2048-unit LSTM had only about a
quarter of the Transformer's block parameters. `rule="paper"` keeps the paper's ratio of LSTM
units to Transformer width instead (2048 / 768, i.e. 8/3 x n_embd).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpt1.config import MODEL_LIMITS, ModelConfig, check_ranges, check_types, from_dict
from gpt1.errors import ConfigError
from gpt1.model.gpt import parameter_count
from gpt1.model.tied import TiedLM

PAPER_UNITS_PER_WIDTH = 2048 / 768


@dataclass
class LSTMConfig:
    """Shape and regularisation of the LSTM baseline. Names shared with `ModelConfig` mean the same."""

    vocab_size: int = 40478
    n_embd: int = 768  # token table width = width of the hidden states heads see
    hidden_size: int = 2048  # LSTM units (the paper's baseline: 2048)
    n_layer: int = 1  # LSTM layers (the paper's baseline: 1)
    n_positions: int = 512  # longest sequence commands will feed (no position table)
    embd_pdrop: float = 0.1
    resid_pdrop: float = 0.1  # dropout on the projected LSTM outputs
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        check_types(self, "lstm")
        check_ranges(
            self,
            "lstm",
            {
                "vocab_size": MODEL_LIMITS["vocab_size"],
                "n_positions": MODEL_LIMITS["n_positions"],
                "n_embd": MODEL_LIMITS["n_embd"],
                "hidden_size": MODEL_LIMITS["n_inner"],
                "n_layer": 64,
            },
        )
        for name in ("embd_pdrop", "resid_pdrop"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ConfigError(f"lstm.{name} must be in [0, 1), got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> LSTMConfig:
        return from_dict(cls, data, source)


def lstm_parameter_count(config: LSTMConfig, exclude_embeddings: bool = False) -> int:
    """Parameters of an `LSTMLM` with `config`, computed without allocating it."""
    E, H = config.n_embd, config.hidden_size
    cell = 4 * H * (E + H) + 8 * H + (config.n_layer - 1) * (4 * H * (2 * H) + 8 * H)
    proj = H * E + E
    return cell + proj + (0 if exclude_embeddings else config.vocab_size * E)


def lstm_config_for(model: ModelConfig, rule: str = "params") -> LSTMConfig:
    """The single-layer LSTM compared with a Transformer of shape `model` (see module docstring).

    rule="params": hidden size whose non-embedding parameter count is closest to the Transformer's
    blocks (multiple of 64). rule="paper": 2048/768 units per unit of Transformer width.
    """
    E = model.n_embd
    if rule == "params":
        target = parameter_count(model, exclude_embeddings=True)
        # 4H^2 + (5E + 8)H + E = target  ->  the positive root, then the nearest multiple of 64.
        b = 5 * E + 8
        root = (-b + math.sqrt(b * b + 16 * max(target - E, 1))) / 8
        hidden = max(64, int(round(root / 64)) * 64)
    elif rule == "paper":
        hidden = max(64, int(round(E * PAPER_UNITS_PER_WIDTH / 64)) * 64)
    else:
        raise ConfigError(f"unknown LSTM sizing rule {rule!r}; choose 'params' or 'paper'")
    return LSTMConfig(
        vocab_size=model.vocab_size,
        n_embd=E,
        hidden_size=hidden,
        n_layer=1,
        n_positions=model.n_positions,
        embd_pdrop=model.embd_pdrop,
        resid_pdrop=model.resid_pdrop,
        initializer_range=model.initializer_range,
    )


class LSTMLM(TiedLM):
    """LSTM language model: `LSTMLM(config)(ids)` -> hidden states `[B, T, n_embd]`; tied head."""

    def __init__(self, config: LSTMConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.lstm = nn.LSTM(
            config.n_embd, config.hidden_size, num_layers=config.n_layer, batch_first=True
        )
        self.c_proj = nn.Linear(config.hidden_size, config.n_embd)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Token table and projection N(0, initializer_range); LSTM uniform(+-1/sqrt(H)), forget bias 1.

        The forget-gate bias of 1 (Jozefowicz et al., 2015) keeps early gradients flowing through
        the cell state; PyTorch splits the bias in two, so each half gets 0.5.
        """
        std = self.config.initializer_range
        nn.init.normal_(self.wte.weight, std=std)
        nn.init.normal_(self.c_proj.weight, std=std)
        nn.init.zeros_(self.c_proj.bias)
        H = self.config.hidden_size
        bound = 1.0 / math.sqrt(H)
        for name, p in self.lstm.named_parameters():
            if name.startswith("weight"):
                nn.init.uniform_(p, -bound, bound)
            else:
                nn.init.zeros_(p)
                with torch.no_grad():
                    p[H : 2 * H].fill_(0.5)  # gate order is input | forget | cell | output

    def hidden_states(
        self, ids: torch.Tensor, lengths: torch.Tensor | None, at: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids `[B, T]` (int64) -> hidden states `[B, T, n_embd]` (or `[B, n_embd]` `at` one
        position per row), and the token table (`forward`, as `GPT`'s).

        `lengths` (the right-padding hint) is ignored: a left-to-right LSTM's real positions never
        see the padding after them, and the states it computes at the padding are not zeroed, as
        nothing reads them.
        """
        x = self.drop(self.wte(ids))  # [B, T, E]
        out, _ = self.lstm(x)  # [B, T, H]; state starts at zero per row
        hidden = self.resid_dropout(self.c_proj(out))  # [B, T, E]
        if at is not None:
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            hidden = hidden[rows, at.to(ids.device)]  # [B, E]
        return hidden, self.wte.weight

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6N over the matrices, including the tied output layer."""
        return 6.0 * lstm_parameter_count(self.config)
