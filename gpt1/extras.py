"""Optional packages (the extras in pyproject.toml): one check, one message, one install line.

A command that needs an extra calls `require` before it imports anything from it, so that a
missing package is one line naming the extra to install, never a traceback:

    gpt1 serve: error: gpt1 serve needs the 'serve' extra (uvicorn is not installed):
    pip install -e '.[serve]'
"""

from __future__ import annotations

import importlib

from gpt1.errors import Gpt1Error

# What each extra is for; the README's table lists the same.
EXTRAS = {
    "serve": "gpt1 serve (fastapi, uvicorn, prometheus_client)",
    "onnx": "gpt1 convert --to onnx (onnx, onnxscript, onnxruntime)",
    "hf": "Hugging Face hub models and datasets (transformers, huggingface_hub, datasets)",
    "eval": "gpt1 lm-eval (lm-eval, accelerate)",
    "track": "--logger tensorboard|wandb|mlflow (tensorboard, wandb, mlflow-skinny)",
    "bench": "benchmarks/inference.py and prepare_memory.py (onnx, onnxruntime, transformers, "
    "ctranslate2, psutil)",
    "dev": "the test suite and linters (every extra above, pytest, ruff, import-linter)",
}


class MissingExtra(Gpt1Error):
    """An optional package a command needs is not installed."""


def install_line(extra: str) -> str:
    """The one way the docs and the errors spell installing an extra (from the repository root)."""
    return f"pip install -e '.[{extra}]'"


def require(extra: str, *modules: str, what: str) -> None:
    """Import each of `modules`, or raise MissingExtra naming `what` needs and the extra that
    provides them."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = getattr(exc, "name", None) or name
            reason = (
                f"{name} is not installed"
                if missing == name
                else f"{name} cannot be imported: {exc}"
            )
            raise MissingExtra(
                f"{what} needs the '{extra}' extra ({reason}): {install_line(extra)}"
            ) from None
