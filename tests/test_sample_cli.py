"""`gpt1 sample` as people use it: streamed text, a prompt from standard input, --interactive."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpt1 import GPT, ModelConfig, save_model
from helpers.tiny import BPE_VOCAB_MODEL

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vocab():
    from conftest import SHARED_DATA

    folder = SHARED_DATA / "gpt1_tokenizer"
    if not folder.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set GPT1_SHARED_DATA)")
    return folder


@pytest.fixture(scope="module")
def tokenizer(vocab):
    from gpt1.text.tokenizer import Tokenizer

    return Tokenizer.from_dir(vocab)


@pytest.fixture(scope="module")
def checkpoint(vocab, tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(ModelConfig(**BPE_VOCAB_MODEL))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    return save_model(model, tmp_path_factory.mktemp("sample") / "ck", tokenizer_dir=vocab)


def test_text_stream_equals_decode(tokenizer):
    from gpt1.inference.generate import TextStream

    rng = random.Random(0)
    newline = tokenizer.encode("\n")
    words = tokenizer.encode("It's 3.5 miles -- doesn't he know? \" quoted \" end .")
    for _ in range(200):
        pool = [rng.randrange(len(tokenizer)) for _ in range(5)] + newline + words
        ids = [rng.choice(pool) for _ in range(rng.randint(0, 25))]
        stream = TextStream(tokenizer)
        text = "".join(stream.push(i) for i in ids) + stream.flush()
        assert text == tokenizer.decode(ids), ids


def test_text_streams_before_generation_ends(checkpoint):
    from gpt1.inference.sampling import Sampling
    from gpt1.recipes.sample import Sampler

    sampler = Sampler(checkpoint, device="cpu", precision="fp32")
    calls = []
    handle = sampler.model.register_forward_hook(lambda *a: calls.append(1))
    greedy = Sampling(max_new_tokens=30, temperature=0)
    try:
        pieces = sampler.stream(sampler.prompt_ids("the old man"), greedy)
        first = next(pieces)
        assert first and len(calls) < 30  # text arrived after a few steps, not all 30
        rest = "".join(pieces)
    finally:
        handle.remove()
    full = sampler.draw(sampler.prompt_ids("the old man"), greedy)[0].text
    assert (first + rest).strip() == full


def gpt1(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "gpt1", *args],
        input=stdin,
        text=True,
        capture_output=True,
        env=env,
        timeout=300,
    )


def test_prompt_from_stdin_and_interactive(checkpoint):
    common = ["--temperature", "0", "--max-new-tokens", "8", "--device", "cpu"]
    direct = [
        gpt1("sample", str(checkpoint), "--prompt", p, *common) for p in ("the old man", "she said")
    ]
    assert all(r.returncode == 0 for r in direct), [r.stderr for r in direct]
    answers = [r.stdout.strip() for r in direct]
    assert answers[0].startswith("the old man ") and answers[0] != answers[1]

    piped = gpt1("sample", str(checkpoint), "--prompt", "-", *common, stdin="the old man\n")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.strip() == answers[0]

    # one answer per line; an empty line ends the conversation (the last line is never answered)
    chat = gpt1(
        "sample",
        str(checkpoint),
        "--interactive",
        *common,
        stdin="the old man\nshe said\n\nnever answered\n",
    )
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.strip().splitlines() == answers
    # end of input ends it too
    chat = gpt1("sample", str(checkpoint), "--interactive", *common, stdin="she said\n")
    assert chat.stdout.strip().splitlines() == answers[1:]


def test_prompt_dash_with_empty_stdin_is_a_clear_error(checkpoint):
    res = gpt1("sample", str(checkpoint), "--prompt", "-", "--device", "cpu", stdin="")
    assert res.returncode == 2 and "standard input held no text" in res.stderr


def test_lstm_checkpoints_sample_too(vocab, tmp_path, capsys):
    from gpt1.cli import main
    from gpt1.model.lstm import LSTMLM, LSTMConfig
    from gpt1.model.registry import save_lstm

    torch.manual_seed(0)
    lstm = LSTMLM(LSTMConfig(vocab_size=40478, n_embd=16, hidden_size=32, n_positions=24))
    folder = save_lstm(lstm, tmp_path / "lstm", tokenizer_dir=vocab)
    greedy = ["--prompt", "the old man", "--temperature", "0", "--max-new-tokens", "30"]
    assert main(["sample", str(folder), *greedy, "--device", "cpu"]) == 0  # past its 24 positions
    out = capsys.readouterr().out.strip()
    assert out.startswith("the old man ") and len(out.split()) > 3


@pytest.mark.parametrize(
    "flags,refused",
    [
        (["--temperature", "nan"], "--temperature"),
        (["--temperature", "inf"], "--temperature"),
        (["--top-p", "nan"], "--top-p"),
        (["--seed", str(10**23)], "--seed"),
        (["--seed", "-1"], "--seed"),
        (["--temperature", "1e-40"], None),
        (["--top-p", "1e-50", "--seed", "3"], None),
        (["--temperature", "5e-324", "--top-k", "5"], None),
    ],
)
def test_extreme_options_sample_or_are_refused_in_one_line(checkpoint, capsys, flags, refused):
    """Streamed text through the CLI: values no generator can use are one line (exit 2) before
    the model loads; values float32 cannot hold but that have a meaning sample greedily."""
    from gpt1.cli import main

    base = ["--quiet", "sample", str(checkpoint), "--prompt", "the old man"]
    try:
        code = main([*base, "--max-new-tokens", "6", *flags])
    except SystemExit as exc:  # the parser's own refusal: a value past 64 bits
        code = exc.code
    out, err = capsys.readouterr()
    if refused:
        assert code == 2 and refused in err and len(err.strip().splitlines()) == 1, err
        return
    assert code == 0, err
    main([*base, "--max-new-tokens", "6", "--temperature", "0"])
    assert out == capsys.readouterr().out  # the limit of a vanishing temperature is greedy


def test_the_sampler_takes_one_sampling_value(checkpoint):
    """`Sampler.draw` and `Sampler.stream` take a `Sampling` (its seed reproduces the draws)."""
    from gpt1.inference.sampling import Sampling
    from gpt1.recipes.sample import Sampler

    sampler = Sampler(checkpoint, device="cpu", precision="fp32")
    ids = sampler.prompt_ids("the old man")
    sampling = Sampling(max_new_tokens=12, temperature=0.9, top_k=30, seed=5)
    drawn = sampler.draw(ids, sampling, num_samples=2)
    again = sampler.draw(ids, sampling, num_samples=2)
    assert [s.ids for s in drawn] == [s.ids for s in again] and len(drawn) == 2
    (one,) = sampler.draw(ids, sampling)  # a batch of one draws as the stream does
    assert "".join(sampler.stream(ids, sampling)).strip() == one.text.strip()
