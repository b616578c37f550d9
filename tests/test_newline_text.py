"""Newline tokens are text: `Tokenizer.decode`, `gpt1 sample`, `gpt1 tokenizer decode` and the
server's completions show them, and a `"\\n"` stop string fires on them.

A character vocabulary with the newline token `"\\n</w>"`, and a tiny GPT whose greedy output is
always that token (its last LayerNorm writes the newline's embedding whatever the input), stand
in for the tour's model, whose greedy continuation is newlines. (The exported tokenizer's
decoding is compared with gpt1's in tests/test_export.py.)
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch

from gpt1 import GPT, save_model
from gpt1.cli import main
from gpt1.config import model_preset
from gpt1.text.tokenizer import Tokenizer
from helpers.tiny import CHAR_PIECES

PROMPT = "the old man"


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("newline") / "vocab"
    folder.mkdir()
    pieces = [*CHAR_PIECES, "\n</w>"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(pieces)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder


@pytest.fixture(scope="module")
def tok(vocab: Path) -> Tokenizer:
    return Tokenizer.from_dir(vocab)


@pytest.fixture(scope="module")
def newline_lm(vocab: Path, tok: Tokenizer, tmp_path_factory) -> Path:
    """A tiny GPT whose greedy next token is the newline, whatever the text."""
    torch.manual_seed(0)
    model = GPT(model_preset("tiny").derive(vocab_size=tok.vocab_size))
    newline = tok.encoder["\n</w>"]
    with torch.no_grad():
        model.wte.weight[newline] *= 10  # the longest row: its own direction scores highest
        last = model.h[-1].ln_2  # post-LN: the last LayerNorm is the output
        last.weight.zero_()
        last.bias.copy_(model.wte.weight[newline])
    return save_model(model, tmp_path_factory.mktemp("newline") / "lm", vocab)


def test_decode_keeps_newlines(tok):
    nl, a, b = tok.encoder["\n</w>"], tok.encoder["a</w>"], tok.encoder["b"]
    assert tok.decode([nl]) == "\n"
    assert tok.decode([a, nl, nl, b, a]) == "a \n \n ba"
    assert tok.decode([a, nl]) == "a \n" and tok.decode([nl, a]) == "\n a"
    assert tok.decode(tok.encode("one\ntwo")) == "one \n two"
    assert tok.decode([]) == ""


def test_greedy_sample_prints_the_newlines(newline_lm, capsys):
    from gpt1.inference.sampling import Sampling
    from gpt1.recipes.sample import sample

    got = sample(newline_lm, prompt=PROMPT, sampling=Sampling(max_new_tokens=3, temperature=0))
    assert got[0].text == "\n \n \n"
    # streamed: the prompt, a space, then the continuation as it comes
    args = ["sample", str(newline_lm), "--prompt", PROMPT, "--temperature", "0"]
    assert main([*args, "--max-new-tokens", "3", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == f"{PROMPT} \n \n \n\n"
    # several samples: printed when done, the same text
    assert main([*args, "--max-new-tokens", "3", "--num-samples", "2"]) == 0
    assert capsys.readouterr().out.split("=== sample 2 ===\n")[1] == f"{PROMPT} \n \n \n\n"


def test_tokenizer_decode_command_writes_the_newlines(vocab, tok, monkeypatch, capsys):
    a, nl, b = tok.encoder["a</w>"], tok.encoder["\n</w>"], tok.encoder["b</w>"]
    lines = "".join(" ".join(map(str, ids)) + "\n" for ids in ([a, nl, b], [nl, a, nl]))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines.encode())))
    assert main(["tokenizer", "decode", "--vocab", str(vocab)]) == 0
    assert capsys.readouterr().out == "a \n b\n" + "\n a \n\n"


def test_continuation_stops_at_a_newline(tok):
    """The server's completion text holds the newline, and a "\\n" stop string cuts before it."""
    from gpt1.serve.openai.text import Continuation

    prompt, nl = tok.encode(PROMPT), tok.encoder["\n</w>"]
    plain = Continuation(tok, prompt, [])
    assert "".join(plain.push(t) for t in [nl, nl]) + plain.finish() == " \n \n" == plain.text
    stopped = Continuation(tok, prompt, ["\n"])
    assert stopped.push(nl) == " " and stopped.stopped
    assert stopped.finish() == "" and stopped.text == " "
    assert stopped.kept_tokens() == []  # the newline lies past the stop


def test_served_completion_shows_newlines_and_stops_on_them(newline_lm):
    pytest.importorskip("fastapi")
    import httpx
    from test_serve import post, serving

    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    with serving(newline_lm) as url:
        plain = post(f"{url}/v1/completions", body).json()["choices"][0]
        stopped = post(f"{url}/v1/completions", {**body, "stop": ["\n"]}).json()
        generated = post(
            f"{url}/v1/generate", {"prompt": PROMPT, "max_new_tokens": 2, "temperature": 0}
        ).json()
        events = httpx.post(f"{url}/v1/completions", json={**body, "stream": True}, timeout=60)
    chunks = [json.loads(x[6:]) for x in events.text.split("\n\n") if x.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == plain["text"]
    assert plain["text"] == " \n \n \n \n" and plain["finish_reason"] == "length"
    assert stopped["choices"][0]["text"] == " " and stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == 0
    assert generated["text"] == "\n \n"
