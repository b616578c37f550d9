"""`gpt1 serve`'s contracts across endpoints: a streamed completion joins into the unstreamed
one; one sampling rule (gpt1 sample's) on every endpoint; every refusal names the field as the
client sent it; the OpenAI endpoints answer every failure in OpenAI's error object; usage and
logprobs describe the text returned; the served model's name; the threads in /health.

A real server on a loopback port (test_serve's `serving`) over a tiny random GPT with a
character vocabulary (test_serve_openai's `lm`).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("fastapi")

from test_serve import TIMEOUT, post, serving, tiny_run, wait_for  # noqa: E402
from test_serve_openai import PROMPT, lm, url  # noqa: E402,F401  (module fixtures)

from gpt1.inference.sampling import Sampling  # noqa: E402
from gpt1.recipes.finetune import load_tokenizer  # noqa: E402
from gpt1.recipes.sample import sample  # noqa: E402
from gpt1.serve.engine import load_engine  # noqa: E402
from gpt1.serve.schemas import Limits  # noqa: E402
from helpers.tiny import char_vocab, run_cli  # noqa: E402

JSON = {"Content-Type": "application/json"}  # what the API reads (else 415)

COMPLETIONS = "/v1/completions"


# ------------------------------------------------------------ streamed == unstreamed
def joined(lines: list[str]) -> tuple[list[dict], dict | None]:
    """A stream's chunks joined per choice (text and logprobs lists concatenated, the last
    finish_reason), and its usage."""
    assert lines[-1] == "data: [DONE]", lines[-3:]
    choices: dict[int, dict] = {}
    usage = None
    for line in lines[:-1]:
        chunk = json.loads(line[len("data: ") :])
        assert "error" not in chunk, chunk
        usage = chunk.get("usage") or usage
        for c in chunk["choices"]:
            into = choices.setdefault(
                c["index"],
                {"index": c["index"], "text": "", "logprobs": None, "finish_reason": None},
            )
            into["text"] += c["text"]
            if c["logprobs"] is not None:
                lists = into["logprobs"] or {k: [] for k in c["logprobs"]}
                into["logprobs"] = {k: lists[k] + c["logprobs"][k] for k in lists}
            into["finish_reason"] = c["finish_reason"] or into["finish_reason"]
    return [choices[i] for i in sorted(choices)], usage


def streamed(address: str, body: dict) -> tuple[int, Any]:
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", address + COMPLETIONS, json=stream_body, timeout=TIMEOUT) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.json()
        return 200, joined([line for line in r.iter_lines() if line.startswith("data: ")])


GRID = [
    {"echo": echo, "logprobs": logprobs, "n": n, "max_tokens": max_tokens, **sampling}
    for echo in (False, True)
    for logprobs in (None, 0, 2)
    for n in (1, 2)
    for max_tokens in (0, 1, 3)
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 11})
]


@pytest.mark.parametrize("fields", GRID, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_stream_joins_into_the_unstreamed_answer(url, fields):  # noqa: F811
    """For every echo x logprobs x n x max_tokens (greedy and seeded): the joined stream has
    the unstreamed answer's text, logprobs and finish_reason per choice, and its usage; a
    request refused unstreamed is refused streamed, alike."""
    body = {"prompt": [PROMPT, "a b"], **fields, "stop": "\u2603"}
    plain = post(url + COMPLETIONS, body)
    status, got = streamed(url, body)
    assert status == plain.status_code, (fields, plain.text)
    if status != 200:
        assert got == plain.json()
        return
    choices, usage = got
    want = plain.json()
    assert usage == want["usage"]
    assert len(choices) == len(want["choices"]) == 2 * fields["n"]
    for c, w in zip(choices, want["choices"]):
        assert (c["index"], c["text"], c["finish_reason"]) == (
            w["index"],
            w["text"],
            w["finish_reason"],
        )
        if w["logprobs"] is None:
            assert c["logprobs"] is None
            continue
        lp, wlp = c["logprobs"], w["logprobs"]
        assert (lp["tokens"], lp["text_offset"]) == (wlp["tokens"], wlp["text_offset"])
        assert [list(t or {}) for t in lp["top_logprobs"]] == [
            list(t or {}) for t in wlp["top_logprobs"]
        ]
        assert [x is None for x in lp["token_logprobs"]] == [
            x is None for x in wlp["token_logprobs"]
        ]
        got_numbers = [x for x in lp["token_logprobs"] if x is not None]
        want_numbers = [x for x in wlp["token_logprobs"] if x is not None]
        assert got_numbers == pytest.approx(want_numbers, abs=1e-5)


def test_echo_max_tokens_1_greedy_stream_sends_the_token(url):  # noqa: F811
    """The scoring path streamed: the generated token arrives (it used to join to the prompt
    alone)."""
    body = {"prompt": PROMPT, "echo": True, "max_tokens": 1, "temperature": 0}
    want = post(url + COMPLETIONS, body).json()["choices"][0]["text"]
    _, (choices, _) = streamed(url, body)
    assert len(want) > len(PROMPT) and choices[0]["text"] == want


# -------------------------------------------------------- one rule, the field named
INF = float("inf")
SEED_CASES = [2**64, 2**70, -1, -(2**63) - 1]
# (endpoint, body, the field the refusal names). Every one is a 422.
BAD = [
    # one visible-text rule for every text the model reads, named as sent
    (COMPLETIONS, {"prompt": "\u200b"}, "prompt"),
    (COMPLETIONS, {"prompt": ["a", " \u2060 "]}, "prompt.1"),
    (COMPLETIONS, {"prompt": "a", "guided_choice": ["yes", "\u200b"]}, "guided_choice.1"),
    (COMPLETIONS, {"prompt": "a", "guided_choice": ["yes", "no"], "n": 2}, "n"),
    *[(COMPLETIONS, {"prompt": "a", "seed": s}, "seed") for s in SEED_CASES],
    *[("/v1/generate", {"prompt": "a", "seed": s}, "seed") for s in SEED_CASES],
    (COMPLETIONS, {"prompt": "a", "seed": 2**64 - 1, "n": 2}, "seed"),  # choice 1: seed + 1
    (COMPLETIONS, {"prompt": "a", "temperature": INF}, "temperature"),
    ("/v1/generate", {"prompt": "a", "temperature": INF}, "temperature"),
    (COMPLETIONS, {"prompt": "a", "temperature": -0.5}, "temperature"),
    (COMPLETIONS, {"prompt": "a", "top_p": float("nan")}, "top_p"),
    ("/v1/generate", {"prompt": "a", "top_p": float("nan")}, "top_p"),
    (COMPLETIONS, {"prompt": "a", "top_p": 0}, "top_p"),
    ("/v1/generate", {"prompt": "a", "top_p": 1.5}, "top_p"),
    (COMPLETIONS, {"prompt": "a", "top_k": 0}, "top_k"),
    ("/v1/generate", {"prompt": "a", "top_k": 0}, "top_k"),
    (COMPLETIONS, {"prompt": "a", "max_tokens": -1}, "max_tokens"),
    ("/v1/generate", {"prompt": "a", "max_new_tokens": -1}, "max_new_tokens"),
    (COMPLETIONS, {"prompt": "a", "max_tokens": 0}, "max_tokens"),
    (COMPLETIONS, {"prompt": "a", "best_of": 2}, "best_of"),
    (COMPLETIONS, {"prompt": "a", "n": 0}, "n"),
    (COMPLETIONS, {"prompt": "a", "temprature": 0}, "temprature"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    (COMPLETIONS, {"prompt": " "}, "prompt"),  # no tokens
    (COMPLETIONS, {"prompt": ["a", ""]}, "prompt.1"),
    (COMPLETIONS, {"prompt": [1, "x"]}, "prompt.1"),
    (COMPLETIONS, {"prompt": [[1, 2], []]}, "prompt.1"),
    (COMPLETIONS, {"prompt": [5, 99999]}, "prompt.1"),
    (COMPLETIONS, {"prompt": [[5], [5, 99999]]}, "prompt.1.1"),
    (COMPLETIONS, {"prompt": ["a", "x " * 60]}, "prompt.1"),  # past the window
    (COMPLETIONS, {}, "prompt"),
    ("/detokenize", {"tokens": [1, 99999]}, "tokens.1"),
    ("/detokenize", {"tokens": [1, "a"]}, "tokens.1"),
    ("/detokenize", {}, "tokens"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/v1/generate", {"prompt": ""}, "prompt"),
    ("/v1/generate", {"prompt": "a", "prompt_ids": [1]}, "prompt"),
    ("/v1/generate", {"prompt_ids": [1, "a"]}, "prompt_ids.1"),
    ("/v1/score", {"items": [{"context": "a"}]}, "items.0.continuation"),
    (
        "/v1/score",
        {"items": [{"context_ids": [99999], "continuation": "a"}]},
        "items.0.context_ids",
    ),
]
OPENAI_PATHS = {COMPLETIONS, "/detokenize", "/tokenize"}


def test_every_refusal_names_the_field_as_sent(url):  # noqa: F811
    """Each bad request: 422, one line whose first word is the field as the client spelled
    it (never a CLI flag, never pydantic's inner names), `param` too in OpenAI's object; no
    500 for any seed."""
    for path, body, field in BAD:
        r = httpx.post(url + path, headers=JSON, content=json.dumps(body), timeout=TIMEOUT)
        assert r.status_code == 422, (path, body, r.text)
        if path in OPENAI_PATHS:
            error = r.json()["error"]
            message = error["message"]
            assert error["param"] == field and error["type"] == "invalid_request_error", r.text
            assert error["code"] == 422
        else:
            message = r.json()["error"]
        assert message.startswith(f"{field}: "), (path, body, message)
        assert "--" not in message and "function-wrap" not in message and "_ids_" not in message


def test_tiny_temperature_and_top_p_are_their_limit_greedy_everywhere(lm, url):  # noqa: F811
    """temperature 1e-30 and top_p 1e-30 are accepted by gpt1 sample, /v1/generate and
    /v1/completions alike, and all give the greedy continuation."""
    tiny = [{"temperature": 1e-30, "seed": 3}, {"top_p": 1e-30, "seed": 3}]
    greedy, cli, nucleus = (
        sample(lm, prompt=PROMPT, sampling=Sampling(max_new_tokens=8, **options))[0]
        for options in ({"temperature": 0}, *tiny)
    )
    for fields in tiny:
        generated = post(f"{url}/v1/generate", {"prompt": PROMPT, "max_new_tokens": 8, **fields})
        completed = post(url + COMPLETIONS, {"prompt": PROMPT, "max_tokens": 8, **fields})
        assert generated.json()["ids"] == greedy.ids[greedy.prompt_len :], fields
        assert completed.json()["choices"][0]["text"] == " " + greedy.text, fields
    assert cli.ids == nucleus.ids == greedy.ids


def test_cli_sample_names_its_flags(lm):  # noqa: F811
    """gpt1 sample applies the same rule, in the words of its flags."""
    base = ["sample", str(lm), "--prompt", "a", "--device", "cpu"]
    for flags, words in (
        (["--seed", "-1"], "--seed must be a whole number in 0..2**64-1"),
        (["--seed", str(2**64)], "--seed"),  # past 64 bits: refused as it is parsed
        (["--temperature", "inf"], "--temperature must be a finite number >= 0"),
        (["--top-p", "0"], "--top-p must be a number in (0, 1]"),
        (["--top-k", "0"], "--top-k must be a whole number >= 1"),
        (["--max-new-tokens", "-2"], "--max-new-tokens must be a whole number >= 0"),
    ):
        code, err = run_cli([*base, *flags])
        assert code == 2 and words in err and len(err.splitlines()) == 1, (flags, err)


# ------------------------------------------------------- OpenAI's error object, the queue
def test_queue_full_and_bugs_answer_in_openais_error_object(lm):  # noqa: F811
    """A full queue: 503, Retry-After and OpenAI's object on /v1/completions; a failing batch:
    500 in the same object; choices past --max-items: 422 naming the limit, never a 503."""
    engine = load_engine(lm)
    scoring = {"echo": True, "max_tokens": 0, "logprobs": 0}
    limits = Limits(max_items=2)
    with serving(engine, limits=limits, max_queue=2, batch_wait_ms=10_000) as address:
        first: dict[str, httpx.Response] = {}
        body = {"prompt": [PROMPT, "a"], **scoring}
        t = threading.Thread(
            target=lambda: first.setdefault("r", post(address + COMPLETIONS, body))
        )
        t.start()
        wait_for(
            lambda: httpx.get(f"{address}/health", timeout=TIMEOUT).json()["queued_items"] == 2
        )
        busy = post(address + COMPLETIONS, {"prompt": "b", **scoring})
        too_many = post(address + COMPLETIONS, {"prompt": PROMPT, "n": 3})
        t.join(TIMEOUT)

        def broken(items: Any) -> Any:
            raise RuntimeError("a bug")

        engine.sequence_logprobs = broken
        bug = post(address + COMPLETIONS, {"prompt": "b", **scoring})
    assert first["r"].status_code == 200
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    error = busy.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (
        error["type"] == "server_error"
        and error["code"] == 503
        and "queue full" in error["message"]
    )
    assert too_many.status_code == 422 and too_many.json()["error"]["param"] == "n"
    assert "--max-items" in too_many.json()["error"]["message"]
    assert bug.status_code == 500 and bug.json()["error"]["type"] == "server_error"
    assert "a bug" in bug.json()["error"]["message"]


def test_max_queue_below_max_items_is_refused_at_start(lm):  # noqa: F811
    code, err = run_cli(["serve", str(lm), "--max-queue", "8", "--max-items", "16"])
    assert code == 2 and "--max-queue 8 is less than --max-items 16" in err


# ------------------------------------------------------------ usage describes the text
def test_a_stop_string_inside_a_token_keeps_that_token(gpt1_vocab):
    """Stopped inside a token (" bl" of " blue"): the token that made the text is kept, so
    the usage counts it and the logprobs list it."""
    from gpt1.serve.engine import SequenceLogprobs
    from gpt1.serve.openai.choices import Choice, choice_json, usage
    from gpt1.serve.openai.schemas import CompletionRequest
    from gpt1.serve.openai.text import Continuation

    tok = load_tokenizer(gpt1_vocab)
    prompt, new = tok.encode("the sky is"), tok.encode("blue and wide")
    assert tok.decode(new[:1]) == "blue"  # one token
    text = Continuation(tok, prompt, ["ue"])
    shown = "".join(text.push(t) for t in new[:2]) + text.finish()
    choice = Choice(0, prompt, text, text.kept_tokens(), "stop")
    n = len(prompt) + len(choice.generated) - 1
    choice.numbers = SequenceLogprobs([-1.0] * n, [[] for _ in range(n)], None)
    body = CompletionRequest(prompt="the sky is", logprobs=0, stop="ue")
    answer = choice_json(tok, choice, body)
    assert shown == text.text == answer["text"] == " bl"
    assert choice.generated == new[:1]
    assert usage([prompt], [choice])["completion_tokens"] == 1
    assert answer["logprobs"]["tokens"] == ["blue "] and answer["logprobs"]["token_logprobs"] == [
        -1.0
    ]
    nothing = Continuation(tok, prompt, [" b"])  # the stop before the token: nothing of it shown
    nothing.push(new[0])
    assert nothing.text == "" and nothing.kept_tokens() == []


# ------------------------------------------------------------ the model's name, threads
def test_the_served_model_is_named_after_its_run(tmp_path):
    """runs/sst2 (its final checkpoint) is served as `sst2`, or as --served-model-name; /health
    says the name and the threads torch runs with."""
    vocab = char_vocab(tmp_path / "vocab")
    run = tiny_run(tmp_path / "sst2", vocab, "sst2")
    with serving(run) as address:
        named = httpx.get(f"{address}/v1/models", timeout=TIMEOUT).json()["data"][0]["id"]
        health = httpx.get(f"{address}/health", timeout=TIMEOUT).json()
    with serving(run, served_model_name="my-model") as address:
        renamed = httpx.get(f"{address}/v1/models", timeout=TIMEOUT).json()["data"][0]["id"]
        ok = post(address + COMPLETIONS, {"model": "my-model", "prompt": "a", "max_tokens": 1})
        other = post(address + COMPLETIONS, {"model": "sst2", "prompt": "a", "max_tokens": 1})
    assert named == "sst2" and health["served_model_name"] == "sst2"
    assert health["threads"] == torch.get_num_threads()
    assert renamed == "my-model" and ok.status_code == 200 and other.status_code == 404
    assert other.json()["error"]["param"] == "model"  # the field as the client sent it


def test_serve_threads_default_to_auto(monkeypatch):
    """serve's --threads is gpt1's one flag: unset, it means auto (not torch's own count)."""
    from gpt1.cli import build_parser
    from gpt1.threads import requested_threads

    monkeypatch.delenv("GPT1_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args = build_parser().parse_args(["serve", "runs/x"])
    assert requested_threads(args.threads) == "auto"
    assert build_parser().parse_args(["serve", "runs/x", "--threads", "auto"]).threads == "auto"
    assert build_parser().parse_args(["serve", "runs/x", "--threads", "3"]).threads == 3


# ------------------------------------------------------------ one event stream, two engines
def _stream(response: Any, gone_after: int | None = None) -> tuple[list[bytes], dict]:
    """The body chunks an ASGI server sends for `response` (the client leaves after
    `gone_after` chunks), and its headers."""
    import asyncio

    chunks: list[bytes] = []
    head: dict = {}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            head.update((k.decode(), v.decode()) for k, v in message["headers"])
        elif message.get("body"):
            if gone_after is not None and len(chunks) == gone_after:
                raise OSError("the client left")
            chunks.append(message["body"])

    async def receive() -> dict:
        await asyncio.sleep(3600)  # no disconnect message: the server learns it from send
        return {"type": "http.disconnect"}

    async def run() -> None:
        scope = {"type": "http", "asgi": {"spec_version": "2.4"}}
        try:
            await response(scope, receive, send)
        except Exception:  # the client left (starlette's ClientDisconnect)
            pass

    asyncio.run(run())
    return chunks, head


def test_an_event_stream_frames_its_events_and_stops_its_work_however_it_ends():
    """`EventStream`: `data: <JSON>` events (an object encoded, a text sent as it is), OpenAI's
    `[DONE]` when asked, uncached; `on_close` runs and the events end when the response ends,
    finished or with the client gone."""
    from gpt1.serve.events import EventStream

    def stream(ended: list[str], done: bool) -> EventStream:
        async def events() -> Any:
            try:
                for n in range(3):
                    yield {"id": n, "text": "é"}
                yield '{"raw":1}'
            finally:
                ended.append("events")

        return EventStream(events(), done=done, on_close=lambda: ended.append("on_close"))

    ended: list[str] = []
    chunks, head = _stream(stream(ended, done=True))
    assert b"".join(chunks).decode() == (
        "".join(f'data: {{"id": {n}, "text": "\\u00e9"}}\n\n' for n in range(3))
        + 'data: {"raw":1}\n\ndata: [DONE]\n\n'
    )
    assert head["content-type"].startswith("text/event-stream")
    assert head["cache-control"] == "no-cache" and ended == ["events", "on_close"]
    chunks, _ = _stream(stream(ended := [], done=False), gone_after=1)
    assert len(chunks) == 1 and ended == ["on_close", "events"]  # stopped at once, then closed


def test_the_engine_is_a_language_model_with_a_classifier_only_when_fine_tuned(lm, tmp_path):  # noqa: F811
    """`load_engine` gives a `LanguageEngine` (scores, generations: it is the batcher's
    `Generations`), with a `ClassifierEngine` for a fine-tuned run only."""
    from gpt1.errors import ConfigError
    from gpt1.inference.generate import sample_ids
    from gpt1.serve.engine import ClassifierEngine, LanguageEngine

    pretrained = load_engine(lm, device="cpu")
    assert isinstance(pretrained, LanguageEngine) and pretrained.classifier is None
    assert (pretrained.kind, pretrained.task, pretrained.fields) == ("language-model", None, {})
    with pytest.raises(ConfigError, match="/v1/predict needs a fine-tuned run"):
        pretrained.examples([{"text": "a"}])
    ids = pretrained.token_ids(PROMPT, None, "prompt")
    greedy = Sampling(max_new_tokens=6, temperature=0.0)
    handle = pretrained.start(*pretrained.generation(ids, greedy))
    tokens = []
    while pretrained.decoder.active:
        tokens += [t for h, t in pretrained.step() if h is handle and t is not None]
    assert tokens == sample_ids(pretrained.lm, torch.tensor([ids]), greedy)[0, len(ids) :].tolist()

    tuned = load_engine(tiny_run(tmp_path / "sst2", char_vocab(tmp_path / "vocab"), "sst2"))
    assert isinstance(tuned.classifier, ClassifierEngine) and tuned.kind == "classifier"
    assert tuned.task is tuned.classifier.task and tuned.lm is tuned.classifier.model.gpt
    assert tuned.describe()["fields"] == list(tuned.fields) == ["text"]
    items = tuned.encode(tuned.examples([{"text": "a fine film"}, {"text": "dull"}]))
    assert tuned.predict(items) == tuned.classifier.predict(items)
