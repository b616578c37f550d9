"""Shared fixtures: the tiny model configs, the tiny prepared corpus, the shared data.

Tests that need ../shared/data skip (saying why) when it is absent.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpt1.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))

# Tests run two workers on two cores: one torch thread each, here and in every `gpt1` command a
# test runs (in this process through gpt1.cli.main, or as a subprocess inheriting the variable),
# so that the suite neither oversubscribes the cores nor spends time measuring the load.
os.environ["GPT1_THREADS"] = "1"
torch.set_num_threads(1)

# The tiny GPT the unit tests build (2 layers, 4 heads of 8); tests override single fields
# (a vocabulary or a context length that makes their point) through `tiny_config`.
TINY_MODEL: dict[str, Any] = dict(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4)
# The smallest model that still has several heads' worth of width to mix (1 layer, 2 heads of 8).
TINIER_MODEL: dict[str, Any] = dict(vocab_size=50, n_positions=24, n_embd=16, n_layer=1, n_head=2)


def tiny_model_config(**overrides: Any) -> ModelConfig:
    """`TINY_MODEL` with `overrides` (for helpers outside fixtures)."""
    return ModelConfig(**{**TINY_MODEL, **overrides})


@pytest.fixture
def tiny_config() -> Callable[..., ModelConfig]:
    """`tiny_config(**overrides)`: the tiny GPT config with some fields changed."""
    return tiny_model_config


@pytest.fixture
def tinier_config() -> Callable[..., ModelConfig]:
    """`tinier_config(**overrides)`: the one-layer, 16-wide config with some fields changed."""
    return lambda **overrides: ModelConfig(**{**TINIER_MODEL, **overrides})


def check_shapes_and_tied_head(model: torch.nn.Module, vocab_size: int, n_embd: int) -> None:
    """The language-model interface GPT and the LSTM share: (B, T) ids give (B, T, n_embd)
    hidden states, and `lm_logits` scores them against the tied input embedding."""
    ids = torch.randint(0, vocab_size, (3, 10))
    hidden = model(ids)
    assert hidden.shape == (3, 10, n_embd)
    logits = model.lm_logits(hidden)
    assert logits.shape == (3, 10, vocab_size)
    torch.testing.assert_close(logits, hidden @ model.wte.weight.T)


def check_causal(model: torch.nn.Module, ids: torch.Tensor, changed: torch.Tensor, t: int) -> None:
    """`changed` first differs from `ids` at position `t`: the outputs before `t` stay as they
    were (nothing looks ahead) and those from `t` on move."""
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t:], b[:, t:])


def subprocess_env() -> dict[str, str]:
    """The environment for running `python -m gpt1` from a test: this checkout, one thread."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "GPT1_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A tiny `gpt1 prepare` folder (two train shards of a noisy periodic token stream, a
    character vocabulary), shared read-only by every test in the session."""
    from gpt1.testing import faults  # the fault harness makes the same corpus for its report

    return faults.make_corpus(tmp_path_factory.mktemp("tiny_corpus") / "data")


@pytest.fixture(scope="module")
def resume_work(tmp_path_factory) -> Path:
    """The folder a module's resume cases share: the cases (gpt1.testing.fault_cases, which the
    fault report runs too) make one finished tiny run in it and copy it for each case."""
    return tmp_path_factory.mktemp("resumes")


def refused_resumes(command: str) -> list[str]:
    """The names of the resume cases of `command` (pretrain, finetune) that must be refused."""
    from gpt1.testing import fault_cases

    return [name for name, (kind, _, _) in fault_cases.RESUME_REFUSED.items() if kind == command]


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set GPT1_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture
def gpt1_vocab(shared_data: Path) -> Path:
    return shared_data / "gpt1_tokenizer"
