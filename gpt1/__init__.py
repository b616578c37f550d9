"""gpt1: a faithful, fast and usable PyTorch implementation of OpenAI's GPT-1 (Radford et al., 2018)."""

from gpt1.config import ModelConfig, model_preset
from gpt1.errors import CheckpointError, ConfigError, DataError, Gpt1Error
from gpt1.model.checkpoint import load_checkpoint, save_model
from gpt1.model.gpt import GPT

__version__ = "0.1.0"


def __getattr__(name: str):
    # The tokenizer pulls in ftfy and spaCy: import it only when asked for.
    if name == "Tokenizer":
        from gpt1.text.tokenizer import Tokenizer

        return Tokenizer
    raise AttributeError(f"module 'gpt1' has no attribute {name!r}")


__all__ = [
    "GPT",
    "ModelConfig",
    "model_preset",
    "load_checkpoint",
    "save_model",
    "Tokenizer",
    "Gpt1Error",
    "ConfigError",
    "DataError",
    "CheckpointError",
    "__version__",
]
