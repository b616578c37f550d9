"""The model registry: every architecture behind one small protocol, built or loaded by name.

Two architectures share the commands: `"gpt"` (`gpt1.model.gpt.GPT`, the paper's Transformer) and
`"lstm"` (`gpt1.model.lstm.LSTMLM`, the Table 5 baseline). Both satisfy `LanguageModel`, which is all
that pretraining, fine-tuning, zero-shot scoring and sampling use. This module is the only place
that knows which class goes with which name:

- `build_model(model_config, arch)`: a fresh model (the LSTM sized to match the Transformer);
- `load_any_checkpoint(path)`: a checkpoint folder (or one `open_checkpoint` opened) as the class
  its `"arch"` key names;
- `model_flops(model)`, `arch_extra(model)`: training FLOPs per token, and the config.json keys a
  checkpoint of it needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from gpt1.config import ModelConfig
from gpt1.errors import CheckpointError, ConfigError
from gpt1.model.checkpoint import (
    ARCH_KEY,
    ARCHS,  # noqa: F401 (re-exported: the architecture names)
    AnyCheckpoint,
    CheckpointFolder,
    checked_weights,
    load_checkpoint,
    load_state_dict,
    opened,
    save_model,
)
from gpt1.model.gpt import GPT
from gpt1.model.lstm import LSTMLM, LSTMConfig, lstm_config_for, lstm_parameter_count


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
    return save_model(model, out_dir, tokenizer_dir, extra=arch_extra(model))  # type: ignore[arg-type]


def checkpoint_arch(path: AnyCheckpoint) -> str:
    """ "gpt" or "lstm": the architecture recorded in a checkpoint's config.json (default "gpt")."""
    return opened(path).arch


def load_any_checkpoint(path: AnyCheckpoint, device: str | torch.device = "cpu") -> nn.Module:
    """Load a checkpoint folder (or a run's newest, or a folder `open_checkpoint` opened) as
    `GPT` or `LSTMLM`, by its `"arch"` key."""
    checkpoint = opened(path)
    if checkpoint.arch == "gpt":
        return load_checkpoint(checkpoint, device)
    return _load_lstm(checkpoint, device).to(device)


def _check_lstm_size(
    config: LSTMConfig, checkpoint: CheckpointFolder, device: str | torch.device
) -> None:
    """Refuse an LSTM config that cannot fit, or that describes more weights than the file holds."""
    from gpt1.model.memory import ensure_fits, human

    source, weights = checkpoint.config_file, checkpoint.weights
    params = lstm_parameter_count(config)
    for where in {"cpu", str(torch.device(device))}:
        ensure_fits(params * 4, "the model", str(source), f"{params:,} parameters", where)
    if weights.stat().st_size < params * 2:
        raise CheckpointError(
            f"{source}: the config describes {params:,} parameters but "
            f"{weights.name} holds {human(weights.stat().st_size)}; config "
            "and weights do not belong together"
        )


def _load_lstm(checkpoint: CheckpointFolder, device: str | torch.device = "cpu") -> LSTMLM:
    try:
        config = LSTMConfig.from_dict(
            checkpoint.config["model"], source=str(checkpoint.config_file)
        )
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    weights = checked_weights(checkpoint)
    _check_lstm_size(config, checkpoint, device)
    with torch.device("meta"):
        model = LSTMLM(config)
    model.load_state_dict(load_state_dict(weights, expect=model), assign=True)
    # nn.LSTM keeps a flat view of its weights for fused kernels; rebuild it after `assign`.
    model.lstm.flatten_parameters()
    return model
