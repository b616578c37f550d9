"""Typed configuration: the model's shape (transformers' `OpenAIGPTConfig` names) and named presets.

Training-related sections (optimiser, schedule, data, run) live beside the model config so that a
whole run resolves to one set of dataclasses: preset -> TOML file -> command-line overrides.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from gpt1.errors import ConfigError


@dataclass
class ModelConfig:
    """Shape and regularisation of a GPT-1 decoder. Defaults are the paper's 117M model."""

    vocab_size: int = 40478          # rows of the token table (grows when task tokens are added)
    n_positions: int = 512           # learned position rows = longest context
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None       # MLP width; None means 4 * n_embd
    afn: str = "gelu"                # "gelu" is GPT-1's tanh approximation (HF: gelu_new); or "relu"
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    # Where embedding dropout acts: "sum" drops the summed token+position vectors (HF);
    # "matrix" drops the embedding tables themselves, as OAI did, and the tied output layer
    # then uses the same dropped token table in that forward pass.
    embd_dropout: str = "sum"

    def __post_init__(self) -> None:
        if self.n_inner is None:
            self.n_inner = 4 * self.n_embd
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.afn not in ("gelu", "relu"):
            raise ConfigError(f"afn must be 'gelu' or 'relu', got {self.afn!r}")
        if self.embd_dropout not in ("sum", "matrix"):
            raise ConfigError(f"embd_dropout must be 'sum' or 'matrix', got {self.embd_dropout!r}")
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ModelConfig":
        return from_dict(cls, data, source)


MODEL_PRESETS: dict[str, ModelConfig] = {
    # The paper's model: 116,534,784 parameters with the 40,478-token vocabulary.
    "gpt1": ModelConfig(),
    # For CPU experiments: a 6-layer, 384-wide model (about 17M parameters with an 8k vocabulary).
    "mini": ModelConfig(vocab_size=8192, n_positions=256, n_embd=384, n_layer=6, n_head=6),
    # For tests: runs a training step in milliseconds.
    "tiny": ModelConfig(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2),
}


def model_preset(name: str) -> ModelConfig:
    """A fresh copy of a named model preset."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
    return dataclasses.replace(MODEL_PRESETS[name])


def from_dict(cls: type, data: dict[str, Any], source: str = "config") -> Any:
    """Build dataclass `cls` from a mapping; unknown keys are an error naming `source`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table of settings, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; "
                          f"known keys are {', '.join(sorted(known))}")
    return cls(**data)


def override(obj: Any, key: str, raw: str, source: str = "override") -> None:
    """Set dataclass field `key` of `obj` from the string `raw`, converted to the field's type."""
    by_name = {f.name: f for f in fields(obj)}
    if key not in by_name:
        raise ConfigError(f"{source}: unknown key {key!r}; known keys are {', '.join(sorted(by_name))}")
    current = getattr(obj, key)
    try:
        if isinstance(current, bool):
            low = raw.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            value: Any = low in ("true", "1", "yes")
        elif isinstance(current, int) and not isinstance(current, bool):
            value = int(raw)
        elif isinstance(current, float):
            value = float(raw)
        elif current is None:
            value = None if raw.lower() in ("none", "null") else _guess(raw)
        else:
            value = raw
    except ValueError:
        raise ConfigError(f"{source}: {key}={raw!r} is not a valid {type(current).__name__}") from None
    setattr(obj, key, value)


def _guess(raw: str) -> Any:
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


__all__ = ["ModelConfig", "MODEL_PRESETS", "model_preset", "from_dict", "override", "field"]
