"""The text pipeline's worker pools (gpt1.text.pool): at most one process per CPU, and the work
done in the calling process, after one warning, when the machine cannot start more (fork failing
with EAGAIN under process-table pressure)."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from gpt1 import threads
from gpt1.text import pool
from gpt1.text.prepare import encode_ordered
from gpt1.text.tokenizer import Tokenizer
from helpers.tiny import char_vocab

TEXTS = [f"line {i}: the quick brown fox, {i * 7} times!" for i in range(40)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_dir(char_vocab(tmp_path_factory.mktemp("vocab")))


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each warning is given once per process; each test starts as a new process would."""
    monkeypatch.setattr(pool, "_warned", False)
    monkeypatch.setattr(threads, "_capped", set())


def fork_fails(monkeypatch, after: int) -> None:
    """os.fork succeeds `after` times, then fails as it does when the process table is full."""
    real, calls = os.fork, []

    def fork() -> int:
        calls.append(None)
        if len(calls) > after:
            raise BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real()

    monkeypatch.setattr(os, "fork", fork)


def pool_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpt1.text.pool"]


# after=1: one worker started, the second refused (the pool ends the first)
@pytest.mark.parametrize("after", [0, 1])
def test_encode_batch_falls_back_to_one_process_with_one_warning(tok, monkeypatch, caplog, after):
    expected = [tok.encode(t) for t in TEXTS]
    fork_fails(monkeypatch, after)
    assert tok.encode_batch(TEXTS, processes=2) == expected
    assert tok.encode_batch(TEXTS, processes=2) == expected  # a second batch: no second warning
    warnings = pool_warnings(caplog)
    assert len(warnings) == 1 and "encoding processes: cannot start 2" in warnings[0]


def test_word_counts_and_prepare_fall_back_too(tok, tmp_path, monkeypatch, caplog):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("banana banana banana bandana\n" * 20, encoding="utf-8")
    merges = Tokenizer.train([corpus], merges=4).merges
    fork_fails(monkeypatch, 0)
    assert Tokenizer.train([corpus], merges=4, processes=2).merges == merges
    encoded = list(encode_ordered(tok, 2, enumerate(TEXTS)))
    assert [k for k, _ in encoded] == list(range(len(TEXTS)))
    assert all(np.array_equal(ids, tok.encode(t)) for (_, ids), t in zip(encoded, TEXTS))
    assert len(pool_warnings(caplog)) == 1


def test_more_processes_than_cpus_are_capped_with_one_warning(tok, monkeypatch, caplog):
    monkeypatch.setattr(threads, "usable_cpus", lambda: [0])
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("a worker was started for one CPU"))
    expected = [tok.encode(t) for t in TEXTS]
    assert tok.encode_batch(TEXTS, processes=10**6) == expected
    assert tok.encode_batch(TEXTS, processes=10**6) == expected
    capped = [r.getMessage() for r in caplog.records if r.name == "gpt1.threads"]
    # (encode_batch asks for no more processes than texts: 40)
    assert capped == ["encoding processes: 40 capped at 1, the CPUs this process may use"]
