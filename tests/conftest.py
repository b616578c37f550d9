"""Shared fixtures: the tiny model configs, the tiny prepared corpus, the shared data.

The tiny inputs themselves (model sizes, corpus, vocabulary, checkpoint, command lines) live in
`helpers.tiny`, which the fault harness and the benchmarks use too. Tests that need
../shared/data skip (saying why) when it is absent.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gpt1.config import ModelConfig
from helpers.tiny import TINIER_MODEL, TINY_MODEL, make_corpus, subprocess_env  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))

# Tests run two workers on two cores: one torch thread each, here and in every `gpt1` command a
# test runs (in this process through gpt1.cli.main, or as a subprocess inheriting the variable),
# so that the suite neither oversubscribes the cores nor spends time measuring the load.
os.environ["GPT1_THREADS"] = "1"
torch.set_num_threads(1)


def _kernel_built_or_off() -> None:
    """No test waits for gpt1's compiled kernel to build (minutes on a loaded machine): where it
    is not built (`make test` builds it first, as `gpt1 kernels build` does), the tests and the
    commands they start use torch's kernels, and the kernel's own tests skip saying so."""
    from gpt1.inference import kernel_build

    if "GPT1_MATVEC" not in os.environ and not kernel_build.is_built():
        os.environ["GPT1_MATVEC"] = "torch"


_kernel_built_or_off()


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


@pytest.fixture
def decoding_operators(monkeypatch):
    """Decoding through the blocks as torch modules, never the one-call step
    (`gpt1.inference.block_step`): for tests of the operator path itself."""
    from gpt1.inference import block_step

    monkeypatch.setattr(block_step, "plan", lambda model, x, integer=False: None)


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


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """A tiny `gpt1 prepare` folder (two train shards of a noisy periodic token stream, a
    character vocabulary), shared read-only by every test in the session."""
    return make_corpus(tmp_path_factory.mktemp("tiny_corpus") / "data")


@pytest.fixture(scope="module")
def resume_work(tmp_path_factory) -> Path:
    """A folder for the resume cases of helpers.fault_cases: they train one tiny run in it per
    test module and copy it for each case."""
    return tmp_path_factory.mktemp("resumes")


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set GPT1_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture
def gpt1_vocab(shared_data: Path) -> Path:
    return shared_data / "gpt1_tokenizer"


# ------------------------------------------------------------------------------ heartbeat
HEARTBEAT_S = 10.0  # pytest prints nothing while long tests run; a line at least this often


class Heartbeat:
    """While no test has finished for HEARTBEAT_S seconds, a line saying how far the run is and
    which tests are running, so a long test never looks like a hang (in the process that
    reports: pytest itself, or xdist's controller)."""

    def __init__(self, config: pytest.Config):
        self.config, self.done, self.running = config, 0, set()
        self.last = self.started = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.running.add(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            self.running.discard(report.nodeid)
            self.done += 1
            self.last = time.monotonic()

    def _beat(self) -> None:
        while not self.stop.wait(1.0):
            now = time.monotonic()
            if now - self.last < HEARTBEAT_S:
                continue
            self.last = now
            names = ", ".join(sorted(n.split("::")[-1] for n in self.running)[:2])
            writer = self.config.get_terminal_writer()
            writer.line(
                f"[{now - self.started:.0f} s: {self.done} tests done; running {names or '...'}]"
            )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: its controller reports
    beat = Heartbeat(config)
    config.pluginmanager.register(beat, "gpt1-heartbeat")
    config._gpt1_heartbeat = beat  # noqa: SLF001


def pytest_sessionstart(session: pytest.Session) -> None:
    beat = getattr(session.config, "_gpt1_heartbeat", None)
    if beat is not None:
        beat.thread.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    beat = getattr(session.config, "_gpt1_heartbeat", None)
    if beat is not None:
        beat.stop.set()
