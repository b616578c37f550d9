"""The model registry: every architecture behind one small protocol, built by name.

Two architectures share the commands: `"gpt"` (`gpt1.model.gpt.GPT`, the paper's Transformer) and
`"lstm"` (`gpt1.model.lstm.LSTMLM`, the Table 5 baseline). Both satisfy `LanguageModel`, which is all
that pretraining, fine-tuning, zero-shot scoring and sampling use. Loading a checkpoint goes
through the architecture table of `gpt1.model.checkpoint` (`load_model`); this module builds:

- `build_model(model_config, arch)`: a fresh model (the LSTM sized to match the Transformer);
- `model_flops(model)`, `arch_extra(model)`: training FLOPs per token, and the config.json keys a
  checkpoint of it needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from gpt1.checkpoint_files import ARCH_KEY
from gpt1.config import ModelConfig
from gpt1.errors import ConfigError
from gpt1.model.checkpoint import save_model
from gpt1.model.gpt import GPT
from gpt1.model.lstm import LSTMLM, lstm_config_for


@runtime_checkable
class LanguageModel(Protocol):
    """What every architecture provides (`GPT`, `LSTMLM`).

    Calling it maps ids `[B, T]` to hidden states `[B, T, n_embd]`; `lengths=` marks right-padded
    rows, `with_head_weight=True` also returns the tied output weight of that pass
    (`gpt1.model.tied.LMOutput`), and `at=` positions `[B]` return only the states there `[B,
    n_embd]` (what a classification head reads; GPT then skips work in its last block).
    """

    config: Any
    wte: nn.Embedding

    def __call__(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor | None = None,
        *,
        at: torch.Tensor | None = None,
        with_head_weight: bool = False,
    ) -> Any: ...
    def lm_weight(self) -> torch.Tensor: ...
    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...
    def add_tokens(self, n: int, generator: torch.Generator | None = None) -> list[int]: ...
    def num_parameters(self, exclude_embeddings: bool = False) -> int: ...
    def flops_per_token(self, seq_len: int | None = None) -> float: ...


def build_model(
    model: ModelConfig, arch: str = "gpt", seq_len: int | None = None
) -> tuple[nn.Module, float, dict[str, Any]]:
    """A fresh model for pretraining: GPT(model) or the matched LSTM (`lstm_config_for(model)`).

    Returns the model, its training FLOPs per token and the extra config.json keys its
    checkpoints need (`{"arch": "lstm"}` for the LSTM, nothing for GPT).
    """
    if arch == "gpt":
        built: nn.Module = GPT(model)
    elif arch == "lstm":
        built = LSTMLM(lstm_config_for(model))
    else:
        raise ConfigError(f"unknown architecture {arch!r}; choose gpt or lstm")
    return built, model_flops(built, seq_len), arch_extra(built)


def arch_extra(model: nn.Module) -> dict[str, Any]:
    """The config.json keys a checkpoint of `model` needs beyond the GPT defaults."""
    return {ARCH_KEY: "lstm"} if isinstance(model, LSTMLM) else {}


def model_flops(model: nn.Module, seq_len: int | None = None) -> float:
    """Training FLOPs per token of a GPT or an LSTMLM."""
    return model.flops_per_token(seq_len)  # type: ignore[operator]


def save_lstm(model: LSTMLM, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
    """Save an `LSTMLM` as a gpt1 checkpoint folder marked `"arch": "lstm"`."""
    return save_model(model, out_dir, tokenizer_dir, extra=arch_extra(model))
