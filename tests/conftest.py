"""Shared fixtures. Tests that need ../shared/data skip (saying why) when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))

torch.set_num_threads(1)  # tests run two workers on two cores; keep them from oversubscribing


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set GPT1_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture
def gpt1_vocab(shared_data: Path) -> Path:
    return shared_data / "gpt1_tokenizer"
