"""`gpt1 serve` end to end: a real uvicorn server on a free loopback port, real HTTP requests.

Tiny random models (built here, no training) with a character vocabulary: one run per task kind
(SST-2 single text, a jsonl entailment-style pair task, a csv similarity regression, a jsonl
multiple-choice task), a GPT checkpoint and an LSTM checkpoint. Most tests run the server in a
thread of this process (cheaper than a process per test); the SIGTERM test runs `gpt1 serve`
as a process. No timing assertions: the timeouts are generous bounds for a loaded machine.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from gpt1.cli import main  # noqa: E402
from gpt1.config import FinetuneConfig, model_preset  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402
from gpt1.model.heads import FinetuneModel  # noqa: E402
from gpt1.recipes.finetune import load_tokenizer, task_record, writer  # noqa: E402
from gpt1.serve.app import create_app  # noqa: E402
from gpt1.serve.engine import Engine, load_engine  # noqa: E402
from gpt1.serve.options import ServeOptions  # noqa: E402
from gpt1.serve.schemas import Limits  # noqa: E402
from gpt1.serve.security import Security  # noqa: E402
from gpt1.serve.server import uvicorn_config  # noqa: E402
from gpt1.tasks.registry import get_task  # noqa: E402
from helpers.tiny import char_vocab  # noqa: E402

JSON = {"Content-Type": "application/json"}  # what the API reads (else 415)

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120.0  # seconds: a bound for a loaded 2-core machine, not a speed check

SENTENCES = [
    "a gripping , funny film .",
    "dull and far too long",
    "it 's a mess",
    "wonderful !",
    "the acting is fine but the plot is thin and the ending drags on forever",
    "not bad",
    "one of the year 's best",
    "i wanted to leave",
]


# ----------------------------------------------------------------------------- fixtures
def tiny_run(out: Path, vocab: Path, task: str, spec: dict | None = None, seed: int = 0) -> Path:
    """A fine-tuned run folder with random weights (what `gpt1 finetune` writes)."""
    torch.manual_seed(seed)
    tok = load_tokenizer(vocab)
    config = model_preset("tiny").derive(vocab_size=tok.vocab_size)
    gpt = GPT(config)
    gpt.add_tokens(3)
    t = get_task(task, spec)
    model = FinetuneModel(gpt, t.kind, t.n_outputs, tok.classify_id)
    torch.nn.init.normal_(model.head.linear.weight, std=0.5)  # spread-out probabilities
    record = task_record(t, FinetuneConfig(task=task), tok, 48)
    (out / "final").mkdir(parents=True)
    writer(vocab, record, {})(model, out / "final")
    return out


def write_rows(path: Path, rows: list[dict], fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as fh:
            out = csv.DictWriter(fh, list(rows[0]))
            out.writeheader()
            out.writerows(rows)
    else:
        keys = list(rows[0])
        path.write_text(
            "\t".join(keys)
            + "\n"
            + "".join("\t".join(str(r[k]) for k in keys) + "\n" for r in rows)
        )


# The four task kinds: (task name, spec, test rows, request field -> row key).
PAIR_SPEC = {
    "columns": {"a": "premise", "b": "claim", "label": "gold", "id": "id"},
    "labels": ["no", "yes"],
}
SIM_SPEC = {
    "columns": {"a": "left", "b": "right", "label": "score"},
    "kind": "similarity",
    "regression": True,
}
CHOICE_SPEC = {
    "columns": {"context": "story", "choices": "endings", "label": "answer"},
    "labels": ["0", "1", "2"],
}


def kind_cases() -> dict[str, tuple[str, dict | None, str, list[dict]]]:
    s = SENTENCES
    return {
        "single": ("sst2", None, "tsv", [{"index": i, "sentence": t} for i, t in enumerate(s)]),
        "pair": (
            "jsonl",
            PAIR_SPEC,
            "jsonl",
            [{"id": f"p{i}", "premise": a, "claim": b} for i, (a, b) in enumerate(zip(s, s[1:]))],
        ),
        "similarity": (
            "csv",
            SIM_SPEC,
            "csv",
            [{"left": a, "right": b} for a, b in zip(s, reversed(s))],
        ),
        "choice": (
            "jsonl",
            CHOICE_SPEC,
            "jsonl",
            [{"story": a, "endings": [b, c, "the end"]} for a, b, c in zip(s, s[1:], s[2:])],
        ),
    }


def tiny_lm(folder: Path, vocab: Path, **sizes: int) -> Path:
    """A pretrained-checkpoint folder: the tiny preset (with `sizes` changed), random weights."""
    from gpt1.model.checkpoint import save_model

    torch.manual_seed(1)
    config = model_preset("tiny").derive(vocab_size=load_tokenizer(vocab).vocab_size, **sizes)
    return save_model(GPT(config), folder, vocab)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("serve")
    vocab = char_vocab(root / "vocab")
    runs = {}
    for kind, (task, spec, fmt, rows) in kind_cases().items():
        run = tiny_run(root / f"run_{kind}", vocab, task, spec)
        data = root / f"data_{kind}"
        name = "test.tsv" if task == "sst2" else f"test.{fmt}"
        write_rows(data / name, rows, fmt)
        runs[kind] = (run, data, rows)
    lm = tiny_lm(root / "lm", vocab)
    from gpt1.model.lstm import LSTMLM, lstm_config_for
    from gpt1.model.registry import save_lstm

    config = model_preset("tiny").derive(vocab_size=load_tokenizer(vocab).vocab_size)
    lstm = save_lstm(LSTMLM(lstm_config_for(config)), root / "lstm", vocab)
    return {"root": root, "vocab": vocab, "runs": runs, "lm": lm, "lstm": lstm}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(model: Path | Engine, **settings: Any) -> Iterator[str]:
    """A real uvicorn server for `model` (a path, or an engine loaded already) on a free
    loopback port, in a thread of this process, configured as `gpt1 serve` configures it
    (`settings`: `ServeOptions` fields)."""
    import uvicorn

    engine = model if isinstance(model, Engine) else load_engine(model)
    security = replace(settings.pop("security", Security()), port=free_port())
    options = ServeOptions(security=security, **settings)
    config = uvicorn_config(create_app(engine, options), options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)


def post(url: str, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(url, json=body, timeout=TIMEOUT, **kw)


def stream_generate(url: str, **body: Any):
    """A streamed /v1/generate request: a context manager over the server-sent events."""
    return httpx.stream(
        "POST", f"{url}/v1/generate", timeout=TIMEOUT, json={**body, "stream": True}
    )


def submission(run: Path, data: Path, out: Path) -> list[str]:
    assert main(["--quiet", "predict", str(run), "--data", str(data), "--out", str(out)]) == 0
    (path,) = out.glob("*.tsv")
    return [line.split("\t")[1] for line in path.read_text().splitlines()[1:]]


def request_items(kind: str, rows: list[dict]) -> list[dict]:
    if kind == "single":
        return [{"text": r["sentence"]} for r in rows]
    return [{k: v for k, v in r.items() if k != "id"} for r in rows]


# -------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind", ["single", "pair", "similarity", "choice"])
def test_predict_equals_gpt1_predict(world, kind, tmp_path):
    """Labels (scores for regression) equal the submission `gpt1 predict` writes, for all four
    task kinds; probabilities are the softmax of the head's outputs for the same inputs."""
    from gpt1.inference.prediction import predict_raw
    from gpt1.recipes.evaluate import load_finetuned
    from gpt1.tasks.batches import encode_split

    run, data, rows = world["runs"][kind]
    expected = submission(run, data, tmp_path / "sub")
    items = request_items(kind, rows)
    with serving(run) as url:
        health = httpx.get(f"{url}/health", timeout=TIMEOUT).json()
        assert set(health["fields"]) == set(items[0]) and health["kind"] == "classifier"
        many = post(f"{url}/v1/predict", {"inputs": items})
        one = post(f"{url}/v1/predict", {"inputs": items[0]})
    assert many.status_code == 200 and one.status_code == 200, many.text
    preds = many.json()["predictions"]
    assert [p["label"] for p in preds] == expected
    assert one.json()["predictions"][0]["label"] == expected[0]
    # The numbers behind the labels: the head's outputs through predict_raw, in process.
    model, record, tok = load_finetuned(run)
    task = get_task(record["task"], record.get("spec") or None)
    sp = task.read(data, "test", need_labels=False)
    raw = predict_raw(model, task, encode_split(sp, task, tok, record["n_ctx"]), 16)
    for p, r in zip(preds, raw):
        if task.regression:
            assert p["score"] == pytest.approx(r, abs=1e-5)
        else:
            probs = p["probabilities"]
            probs = list(probs.values()) if isinstance(probs, dict) else probs
            assert probs == pytest.approx(torch.tensor(r).double().softmax(-1).tolist(), abs=1e-5)
            assert sum(probs) == pytest.approx(1.0)
    with serving(run) as url:  # not every example lands in one batch: still the same labels
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(8) as pool:
            alone = list(pool.map(lambda it: post(f"{url}/v1/predict", {"inputs": it}), items))
    assert [r.json()["predictions"][0]["label"] for r in alone] == expected


def test_generate_equals_gpt1_sample(world):
    """Greedy output equals `gpt1 sample --temperature 0`; seeded sampling equals `gpt1 sample
    --seed`; the SSE stream carries the same tokens, then the whole text."""
    from gpt1.inference.sampling import Sampling
    from gpt1.recipes.sample import sample

    lm, prompt = world["lm"], "the old man"
    greedy = sample(lm, prompt=prompt, sampling=Sampling(max_new_tokens=30, temperature=0))[0]
    drawn = Sampling(max_new_tokens=30, temperature=0.9, top_k=20, top_p=0.95, seed=7)
    seeded = sample(lm, prompt=prompt, sampling=drawn)[0]
    with serving(lm) as url:
        g = post(
            f"{url}/v1/generate", {"prompt": "the old man", "max_new_tokens": 30, "temperature": 0}
        ).json()
        s = post(
            f"{url}/v1/generate",
            {
                "prompt": "the old man",
                "max_new_tokens": 30,
                "temperature": 0.9,
                "top_k": 20,
                "top_p": 0.95,
                "seed": 7,
            },
        ).json()
        with stream_generate(url, prompt="the old man", max_new_tokens=30, temperature=0) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        ids = post(
            f"{url}/v1/generate",
            {"prompt_ids": greedy.ids[: greedy.prompt_len], "max_new_tokens": 30, "temperature": 0},
        ).json()
    new = greedy.ids[greedy.prompt_len :]
    assert (
        g["ids"] == new
        and g["text"] == greedy.text
        and g["prompt_ids"] == greedy.ids[: greedy.prompt_len]
    )
    assert s["ids"] == seeded.ids[seeded.prompt_len :] and s["text"] == seeded.text
    assert ids["ids"] == new
    *tokens, done = events
    assert [e["id"] for e in tokens] == new and done["done"] and done["ids"] == new
    assert "".join(e["text"] for e in tokens) == done["text"] == greedy.text


def test_concurrent_generations_are_decoded_together_and_equal_gpt1_sample(world):
    """Eight clients at once: each gets `gpt1 sample`'s greedy tokens for its prompt, and the
    decoder ran several of them in one step (the generate batch-size histogram)."""
    from gpt1.inference.sampling import Sampling
    from gpt1.recipes.sample import sample

    lm = world["lm"]
    prompts = [f"the {w} man" for w in ("old", "young", "tall", "quiet", "angry", "kind", "odd")]
    prompts.append("a")
    greedy = Sampling(max_new_tokens=40, temperature=0)
    want = {p: sample(lm, prompt=p, sampling=greedy)[0] for p in prompts}
    got: dict[str, Any] = {}
    with serving(lm) as url:

        def ask(p: str) -> None:
            body = {"prompt": p, "max_new_tokens": 40, "temperature": 0}
            got[p] = post(f"{url}/v1/generate", body).json()

        threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        metrics = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    for p in prompts:
        assert got[p]["ids"] == want[p].ids[want[p].prompt_len :], p
    lines = dict(
        line.rsplit(" ", 1)
        for line in metrics.splitlines()
        if line.startswith("gpt1_batch_items_") and 'kind="generate"' in line
    )
    steps = float(lines['gpt1_batch_items_count{kind="generate"}'])
    alone = float(lines['gpt1_batch_items_bucket{kind="generate",le="1.0"}'])
    assert steps >= 40 and alone < steps  # some steps decoded two or more generations


def test_lstm_checkpoint_generates_and_scores(world):
    from gpt1.inference.sampling import Sampling
    from gpt1.recipes.sample import sample

    greedy = Sampling(max_new_tokens=8, temperature=0)
    expected = sample(world["lstm"], prompt="hello", sampling=greedy)[0]
    with serving(world["lstm"]) as url:
        g = post(f"{url}/v1/generate", {"prompt": "hello", "max_new_tokens": 8, "temperature": 0})
        sc = post(f"{url}/v1/score", {"items": [{"context": "hel", "continuation": "lo"}]})
    assert g.json()["ids"] == expected.ids[expected.prompt_len :]
    assert sc.status_code == 200 and sc.json()["results"][0]["tokens"] >= 1


def test_score_equals_the_zero_shot_scorer(world):
    from gpt1.checkpoint_files import open_checkpoint
    from gpt1.inference.scoring import Scorer
    from gpt1.model.checkpoint import load_model
    from gpt1.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(world["lm"])
    pairs = [("the film was very", "good"), ("the film was very", "bad"), ("a", "b c d e")]
    expected = Scorer(load_model(open_checkpoint(world["lm"]))).score(
        [(tok.encode(c), tok.encode(x)) for c, x in pairs], greedy=True
    )
    with serving(world["lm"]) as url:
        r = post(
            f"{url}/v1/score",
            {
                "items": [{"context": c, "continuation": x} for c, x in pairs]
                + [{"context_ids": [5, 6], "continuation_ids": [7]}]
            },
        )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    for got, want in zip(results, expected):
        assert got["logprobs"] == pytest.approx(want.logprobs, abs=1e-5)
        assert got["total"] == pytest.approx(want.total, abs=1e-4) and got["greedy"] == want.greedy
    assert results[3]["tokens"] == 1


def test_health_metrics_and_openapi(world):
    from prometheus_client.parser import text_string_to_metric_families

    run = world["runs"]["pair"][0]
    with serving(run) as url:
        assert (
            post(f"{url}/v1/predict", {"inputs": {"premise": "a", "claim": "b"}}).status_code == 200
        )
        assert post(f"{url}/v1/predict", {"inputs": {"premise": "a"}}).status_code == 422
        health = httpx.get(f"{url}/health", timeout=TIMEOUT).json()
        text = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
        schema = httpx.get(f"{url}/openapi.json", timeout=TIMEOUT).json()
        docs = httpx.get(f"{url}/docs", timeout=TIMEOUT)
    assert (
        health["status"] == "ok" and health["task"] == "jsonl" and health["labels"] == ["no", "yes"]
    )
    assert health["model"] == f"{run.name}/final" and health["checkpoint"] == "final"
    # The page works offline: nothing loaded from elsewhere, the schema read from this server.
    assert docs.status_code == 200 and "/openapi.json" in docs.text
    assert "<script src" not in docs.text and "https://" not in docs.text
    # Errors are documented as the server sends them: {"error": "..."}, not FastAPI's {detail}.
    for path in ("/v1/predict", "/v1/generate", "/v1/score"):
        responses = schema["paths"][path]["post"]["responses"]
        for status in ("408", "413", "422", "503"):
            ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorBody"), (path, status, ref)
    assert set(schema["components"]["schemas"]["ErrorBody"]["properties"]) == {"error"}
    # The OpenAI-compatible endpoints refuse in OpenAI's shape, and say so.
    responses = schema["paths"]["/v1/completions"]["post"]["responses"]
    for status, body in (
        ("413", "OpenAIErrorBody"),
        ("415", "OpenAIErrorBody"),
        ("422", "OpenAIErrorBody"),
        ("503", "OpenAIErrorBody"),
    ):
        ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith(f"/{body}"), (status, ref)
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("gpt1_requests_total", (("code", "200"), ("endpoint", "/v1/predict")))] == 1
    assert samples[("gpt1_requests_total", (("code", "422"), ("endpoint", "/v1/predict")))] == 1
    assert samples[("gpt1_batch_items_count", (("kind", "predict"),))] == 1
    assert samples[("gpt1_request_seconds_count", (("endpoint", "/v1/predict"),))] == 2
    assert {"/v1/predict", "/v1/generate", "/v1/score", "/health", "/metrics"} <= set(
        schema["paths"]
    )
    item = schema["components"]["schemas"]["PredictItem"]
    assert set(item["properties"]) == {"premise", "claim"}


BAD_REQUESTS = [
    ("/v1/predict", {"inputs": {"text": "ok", "colour": "red"}}, 422, "inputs.colour: Extra"),
    ("/v1/predict", {"inputs": [{"text": "ok"}, {"txt": "x"}]}, 422, "inputs.1.text: Field"),
    ("/v1/predict", {"inputz": [{"text": "ok"}]}, 422, "inputs"),
    ("/v1/predict", {"inputs": {"text": 5}}, 422, "valid string"),
    ("/v1/predict", {"inputs": {"text": ""}}, 422, "at least 1"),
    ("/v1/predict", {"inputs": {"text": "   "}}, 422, "empty text"),
    ("/v1/predict", {"inputs": []}, 422, "at least 1"),
    ("/v1/predict", {"inputs": [{"text": "a"}] * 5}, 422, "at most 4"),
    ("/v1/predict", {"inputs": {"text": "x" * 101}}, 422, "at most 100"),
    ("/v1/generate", {"prompt": "a", "max_new_tokens": 11}, 422, "less than or equal to 10"),
    ("/v1/generate", {"prompt": "a", "temperature": "hot"}, 422, "valid number"),
    ("/v1/generate", {"prompt": "a", "top_p": 1.5}, 422, "top_p"),
    ("/v1/generate", {"prompt": "a", "prompt_ids": [1]}, 422, "exactly one"),
    ("/v1/generate", {"prompt_ids": [999999]}, 422, "outside the vocabulary"),
    ("/v1/generate", {"prompt_ids": [5] * 65}, 422, "-token window"),
    ("/v1/generate", {"prompt": "a", "stream": "yes"}, 422, "valid boolean"),
    ("/v1/score", {"items": [{"context": "a"}]}, 422, "continuation"),
    # sampling options out of gpt1's one rule (gpt1.inference.sampling)
    ("/v1/generate", {"prompt": "a", "seed": 2**64}, 422, "seed: must be a whole number in"),
    ("/v1/generate", {"prompt": "a", "seed": -1}, 422, "seed: must be a whole number in"),
    # texts with nothing printable, and a bare string where items go
    ("/v1/predict", {"inputs": {"text": "\u0000"}}, 422, "inputs.text: empty text"),
    ("/v1/predict", {"inputs": [{"text": "a"}, {"text": "\u200b"}]}, 422, "inputs.1.text: empty"),
    ("/v1/generate", {"prompt": "\u200b\u200b"}, 422, "prompt: empty text"),
    (
        "/v1/score",
        {"items": [{"context": "a", "continuation": "\u2060"}]},
        422,
        "items.0.continuation: empty",
    ),
    ("/v1/predict", {"inputs": {"text": "\u200b\t"}}, 422, "no printable"),
    ("/v1/predict", {"inputs": "a fine film"}, 422, "not a bare string"),
    ("/v1/nothing", {}, 404, "no such endpoint"),
]


def test_each_app_checks_and_documents_its_own_limits(world):
    """Two apps in one process, one with small limits: each refuses past its own bounds only,
    and its OpenAPI schema shows its own bounds."""
    run = world["runs"]["single"][0]
    small = Limits(max_items=4, max_chars=100, max_new_tokens=10)
    five = {"inputs": [{"text": "a"}] * 5}
    with serving(run, limits=small) as url_small, serving(run) as url_default:
        assert "at most 4" in post(f"{url_small}/v1/predict", five).json()["error"]
        assert post(f"{url_default}/v1/predict", five).status_code == 200
        generate = {"prompt": "a", "max_new_tokens": 11}
        assert post(f"{url_small}/v1/generate", generate).status_code == 422
        assert post(f"{url_default}/v1/generate", generate).status_code == 200
        schemas = [
            httpx.get(f"{url}/openapi.json", timeout=TIMEOUT).json()["components"]["schemas"]
            for url in (url_small, url_default)
        ]
    for schema, (items, chars, new_tokens) in zip(schemas, [(4, 100, 10), (64, 20_000, 1024)]):
        assert schema["PredictRequest"]["properties"]["inputs"]["maxItems"] == items
        assert schema["PredictItem"]["properties"]["text"]["maxLength"] == chars
        assert schema["GenerateRequest"]["properties"]["max_new_tokens"]["maximum"] == new_tokens
        assert schema["CompletionRequest"]["properties"]["max_tokens"]["anyOf"][0]["maximum"] == (
            new_tokens
        )


def test_bad_requests_get_a_one_line_4xx(world):
    run = world["runs"]["single"][0]
    limits = Limits(max_items=4, max_chars=100, max_new_tokens=10, max_body_bytes=2000)
    with serving(run, limits=limits) as url:
        for path, body, status, words in BAD_REQUESTS:
            r = post(url + path, body)
            assert r.status_code == status, (path, body, r.text)
            message = r.json()["error"]
            assert words in message and "\n" not in message and "Traceback" not in message, message
        raw = httpx.post(f"{url}/v1/predict", headers=JSON, content=b"{not json", timeout=TIMEOUT)
        assert raw.status_code == 422 and raw.json()["error"] == "body is not valid JSON"
        for body, words in (
            (b'{"prompt": "a", "temperature": Infinity}', "temperature: must be a finite"),
            (b'{"prompt": "a", "top_p": NaN}', "top_p: must be a number in (0, 1], got nan"),
        ):
            r = httpx.post(f"{url}/v1/generate", headers=JSON, content=body, timeout=TIMEOUT)
            assert r.status_code == 422 and words in r.json()["error"], r.text
        big = post(f"{url}/v1/predict", {"inputs": {"text": "y" * 5000}})
        assert big.status_code == 413 and "2000 bytes" in big.json()["error"]
        chunked = httpx.post(
            f"{url}/v1/predict",
            timeout=TIMEOUT,
            headers=JSON,
            content=iter([b'{"inputs": {"text": "', b"z" * 3000, b'"}}']),
        )
        assert chunked.status_code == 413
        assert httpx.get(f"{url}/v1/predict", timeout=TIMEOUT).status_code == 405
        # the worker is alive and well after all of that
        assert post(f"{url}/v1/predict", {"inputs": {"text": "fine"}}).status_code == 200
    with serving(world["lm"]) as url:
        r = post(f"{url}/v1/predict", {"inputs": {"text": "a"}})
        assert r.status_code == 404 and "fine-tuned run" in r.json()["error"]


def test_queue_limit_answers_503_with_retry_after(world):
    """A batch waiting for company holds its items in the queue: past max_queue, 503."""
    run = world["runs"]["single"][0]
    small = Limits(max_items=2)  # --max-queue holds the largest request (--max-items)
    with serving(run, limits=small, max_queue=2, batch_wait_ms=10_000) as url:  # a wide window
        first: dict[str, httpx.Response] = {}
        t = threading.Thread(
            target=lambda: first.setdefault(
                "r", post(f"{url}/v1/predict", {"inputs": [{"text": "a"}, {"text": "b"}]})
            )
        )
        t.start()
        wait_for(lambda: httpx.get(f"{url}/health", timeout=TIMEOUT).json()["queued_items"] == 2)
        busy = post(f"{url}/v1/predict", {"inputs": {"text": "c"}})
        t.join(TIMEOUT)
        after = post(f"{url}/v1/predict", {"inputs": {"text": "c"}})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert "queue full" in busy.json()["error"]
    assert first["r"].status_code == 200 and after.status_code == 200


def wait_for(condition, timeout: float = TIMEOUT, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(poll)


def wait_until_serving(proc: subprocess.Popen, url: str) -> None:
    """Wait until the `gpt1 serve` process `proc` answers `/health` at `url`; fails with what
    it printed (its stdout, where stderr is joined to it) if it exits first."""

    def up() -> bool:
        if proc.poll() is not None:
            said = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"gpt1 serve exited with status {proc.returncode}: {said}")
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up)


def test_sigterm_finishes_requests_in_flight_then_exits(world):
    """`gpt1 serve` as a process: SIGTERM while a predict request waits in the batcher and a
    stream is running; both complete, then the process exits with status 0."""
    run = world["runs"]["single"][0]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpt1",
            "serve",
            str(run),
            "--port",
            str(port),
            "--batch-wait-ms",
            "8000",
            "--threads",
            "1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_serving(proc, url)
        results: dict[str, Any] = {}
        predict = threading.Thread(
            target=lambda: results.setdefault(
                "predict", post(f"{url}/v1/predict", {"inputs": [{"text": "a"}, {"text": "b"}]})
            )
        )
        predict.start()
        wait_for(lambda: httpx.get(f"{url}/health", timeout=TIMEOUT).json()["queued_items"] == 2)
        with stream_generate(url, prompt="abc", max_new_tokens=40, temperature=0) as stream:
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            proc.send_signal(signal.SIGTERM)
            rest = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        predict.join(TIMEOUT)
        assert proc.wait(TIMEOUT) == 0
        said = proc.stdout.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert said.count("CPU threads") == 1 and "1 CPU threads: asked for" in said  # once, at start
    assert "id" in json.loads(first[6:])
    assert rest[-1]["done"] and len(rest[-1]["ids"]) == 40
    assert results["predict"].status_code == 200
    assert len(results["predict"].json()["predictions"]) == 2
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=5)


def test_cli_refuses_bad_options(world, capsys):
    run = world["runs"]["single"][0]
    assert main(["serve", str(run), "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["serve", str(world["root"] / "missing")]) == 2
    with pytest.raises(SystemExit):
        main(["serve", str(run), "--precision", "fp8"])
    capsys.readouterr()
    for threads in ("0", "-1"):  # gpt1's one --threads flag, checked as it is parsed
        with pytest.raises(SystemExit):
            main(["serve", str(run), "--threads", threads])
        assert "--threads must be 'auto' or a positive whole number" in capsys.readouterr().err
    bad = [
        (["--device", "tpu"], "device 'tpu'"),
        (["--max-queue", "8", "--max-items", "9"], "--max-queue 8 is less than --max-items 9"),
        (["--served-model-name", " "], "--served-model-name must not be empty"),
        (["--request-timeout", "0"], "--request-timeout must be > 0"),
        (["--max-connections", "0"], "--max-connections must be >= 1"),
    ]
    if not torch.cuda.is_available():
        bad.append((["--device", "cuda"], "no CUDA device is available"))
    for options, words in bad:
        assert main(["serve", str(run), *options]) == 2, options
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err


def test_bf16_engine_predicts(world):
    """bf16 serves the same endpoints; its agreement with fp32 is measured (benchmarks) not
    assumed, so here only that it predicts valid labels and probabilities."""
    run, data, rows = world["runs"]["single"]
    engine = load_engine(run, precision="bf16")
    assert engine.lm.wte.weight.dtype == torch.bfloat16
    preds = engine.predict(engine.encode(engine.examples([{"text": r["sentence"]} for r in rows])))
    assert all(p.label in ("0", "1") and sum(p.probabilities) == pytest.approx(1.0) for p in preds)
