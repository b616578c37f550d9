"""`gpt1 serve` under pressure, seen from the client side: the generation cap and the memory it
bounds, clients that leave, slow tokenization, slow or piled-up connections, score limits.

Real servers on loopback ports (`test_serve.serving`, or `gpt1 serve` as a process where its
memory is measured). No timing assertions: where order matters the test waits on events, and
the timeouts are generous bounds for a loaded machine.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from test_serve import (  # noqa: E402
    ROOT,
    TIMEOUT,
    free_port,
    post,
    serving,
    tiny_lm,
    wait_for,
    wait_until_serving,
)

from gpt1.serve.engine import load_engine  # noqa: E402
from gpt1.serve.schemas import Limits  # noqa: E402
from helpers.tiny import char_vocab  # noqa: E402

JSON = {"Content-Type": "application/json"}  # what the API reads (else 415)


def metric(url: str, name: str, labels: str = "") -> float:
    """One sample of the server's /metrics (0 when absent)."""
    for line in httpx.get(f"{url}/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """The tiny language model of `test_serve`'s world."""
    root = tmp_path_factory.mktemp("serve_limits")
    return {"lm": tiny_lm(root / "lm", char_vocab(root / "vocab"))}


# --------------------------------------------------------------------------- the cap
CAP = 2
N_POSITIONS, N_EMBD, N_LAYER = 512, 192, 8
PROMPT_LEN = 480  # with 24 new tokens, a cache of 504 of the 512 positions per generation


def cache_bytes() -> int:
    """One generation's key/value cache at most: 2 x n_layer x n_positions x n_embd floats."""
    return 2 * N_LAYER * N_POSITIONS * N_EMBD * 4


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory) -> Any:
    """`gpt1 serve --max-generations 2` as a process, on a model whose caches are big enough to
    see in the process's memory (6 MiB each)."""
    root = tmp_path_factory.mktemp("capped")
    sizes = dict(n_positions=N_POSITIONS, n_embd=N_EMBD, n_layer=N_LAYER, n_head=3)
    lm = tiny_lm(root / "lm", char_vocab(root / "vocab"), **sizes)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpt1", "serve", str(lm), "--port", str(port)]
        + ["--max-generations", str(CAP), "--threads", "1", "--device", "cpu"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()


def stream_events(url: str, body: dict, on_event: Any) -> None:
    with httpx.stream("POST", f"{url}/v1/generate", json=body, timeout=TIMEOUT) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                on_event(json.loads(line[6:]))


@pytest.mark.slow
def test_at_most_cap_streams_get_tokens_before_the_first_finishes(capped_server):
    """8 clients each stream a 150-token greedy generation at once, cap 2. Two generations run;
    the others wait until one ends. As a clock robust to client threads lagging the server: when
    a stream gets its first token, has any stream got half its tokens yet? With the cap only
    the first two start before that; decoded all together, all 8 would."""
    url, _ = capped_server
    new_tokens = 150
    lock = threading.Lock()
    received = [0] * 8
    early: list[int] = []  # streams whose first token came before any stream was half-way
    done: list[int] = []

    def client(n: int) -> None:
        def on_event(event: dict) -> None:
            with lock:
                if "id" in event:
                    received[n] += 1
                    if received[n] == 1 and max(received) < new_tokens // 2:
                        early.append(n)
                elif event.get("done"):
                    done.append(n)

        body = {"prompt": f"client {n} says", "max_new_tokens": new_tokens, "temperature": 0}
        stream_events(url, {**body, "stream": True}, on_event)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert sorted(done) == list(range(8)) and received == [new_tokens] * 8
    assert 1 <= len(early) <= CAP, early


class CountingGenerations:
    """`Generations` whose requests are (name, steps): one token a step, then done. Records the
    most generations stepped together and the names started."""

    def __init__(self) -> None:
        self.active: dict[int, list] = {}
        self.most = 0
        self.started: list[str] = []

    def start(self, name: str, steps: int) -> int:
        self.started.append(name)
        handle = len(self.started)
        self.active[handle] = [steps]
        return handle

    def step(self) -> list[tuple[Any, Any]]:
        self.most = max(self.most, len(self.active))
        events: list[tuple[Any, Any]] = []
        for handle, left in list(self.active.items()):
            left[0] -= 1
            events.append((handle, 1))
            if left[0] == 0:
                events.append((handle, None))
                del self.active[handle]
        return events

    def stop(self, handle: Any) -> None:
        self.active.pop(handle, None)


def test_batcher_runs_at_most_the_cap_and_serves_predictions_meanwhile():
    """Cap 2, five generations of 30 steps queued: never more than 2 stepped together; a predict
    job queued behind the waiting generations runs before they finish; a queued generation
    whose client left is never started."""
    import asyncio

    from gpt1.serve.batcher import Batcher, Job

    gens = CountingGenerations()
    started_by_then: list[str] = []  # the generations started when the predict batch ran

    def run_batch(kind: str, items: list) -> list:
        started_by_then.extend(gens.started)
        return items

    batcher = Batcher(run_batch, max_active_generations=2, generations=gens)

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        order: list[str] = []
        finished = asyncio.Event()

        def ended(name: str) -> Any:
            def emit(item: Any) -> None:
                if item is None:
                    order.append(name)
                    if len(order) == 5:  # g4 never runs
                        finished.set()

            return emit

        jobs = [Job("generate", (f"g{n}", 30), 1, 1, loop, emit=ended(f"g{n}")) for n in range(6)]
        jobs[4].cancelled.set()  # its client left while it waited
        predict = Job("predict", ["x"], 1, 1, loop, future=loop.create_future())
        for job in jobs[:5]:
            batcher.submit(job)
        batcher.submit(predict)
        batcher.submit(jobs[5])
        batcher.start()
        await predict.future
        await asyncio.wait_for(finished.wait(), TIMEOUT)
        return order

    try:
        order = asyncio.run(scenario())
    finally:
        batcher.stop(TIMEOUT)
    assert gens.most == 2
    assert "g4" not in gens.started and sorted(gens.started) == ["g0", "g1", "g2", "g3", "g5"]
    assert started_by_then == ["g0", "g1"]  # the predict job did not wait behind g2, g3, g5
    assert sorted(order) == ["g0", "g1", "g2", "g3", "g5"]


def rss(pid: int) -> int:
    """Resident memory of process `pid`, in bytes (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_memory_stays_bounded_under_64_generation_clients(capped_server):
    """64 clients ask for generations with 480-token prompts at once: the server's resident
    memory grows by at most cap x cache + a margin (64 caches would be ~250 MB more)."""
    url, pid = capped_server
    prompt = [(7 * i) % 90 + 1 for i in range(PROMPT_LEN)]
    body = {"prompt_ids": prompt, "max_new_tokens": 24, "temperature": 0}
    for _ in range(2):  # warm: the allocator's pools and the first caches exist
        assert post(f"{url}/v1/generate", body).status_code == 200
    base, peak = rss(pid), 0
    results: list[int] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(post(f"{url}/v1/generate", body).status_code)
        )
        for _ in range(64)
    ]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss(pid))
        time.sleep(0.01)
    margin = 64 << 20  # request objects, prompt activations, allocator slack
    assert results == [200] * 64
    grew = peak - base
    print(f"server RSS {base / 2**20:.0f} MiB at rest, +{grew / 2**20:.1f} MiB at peak")
    assert grew <= CAP * cache_bytes() + margin, (
        f"grew {grew / 2**20:.0f} MiB; cap x cache = {CAP * cache_bytes() / 2**20:.0f} MiB"
    )


# ------------------------------------------------------------------ clients that leave
def generation_steps(url: str) -> float:
    return metric(url, "gpt1_batch_items_count", '{kind="generate"}')


def test_a_dropped_stream_frees_its_slot(world):
    """Cap 1: a client drops its (near endless) stream after two tokens; the generation is
    stopped (the active gauge falls to 0 long before its tokens could be decoded), and the next
    client gets the slot."""
    limits = Limits(max_new_tokens=100_000)
    with serving(world["lm"], limits=limits, max_generations=1) as url:
        body = {"prompt": "the old man", "max_new_tokens": 100_000, "stream": True}
        with httpx.stream("POST", f"{url}/v1/generate", json=body, timeout=TIMEOUT) as r:
            lines = r.iter_lines()
            [next(line for line in lines if line.startswith("data: ")) for _ in range(2)]
            assert metric(url, "gpt1_active_generations") == 1
        wait_for(lambda: metric(url, "gpt1_active_generations") == 0)
        assert generation_steps(url) < 50_000
        after = post(f"{url}/v1/generate", {"prompt": "a", "max_new_tokens": 5})
        assert after.status_code == 200 and len(after.json()["ids"]) == 5
        assert metric(url, "gpt1_requests_in_flight") == 1  # this /metrics request only


def raw_request(port: int, path: str, body: bytes, head_only: bool = False) -> socket.socket:
    """A socket that has sent a POST (all of it, or its headers and half its body)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + (body[: len(body) // 2] if head_only else body))
    return sock


def test_a_plain_generation_stops_when_its_client_leaves(world):
    """A non-streaming /v1/generate whose client disconnects is stopped within a step: its slot
    frees, the request is counted as 499, and decoding does not run on for nobody."""
    limits = Limits(max_new_tokens=100_000)
    with serving(world["lm"], limits=limits, max_generations=1) as url:
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"prompt": "the old man", "max_new_tokens": 100_000}).encode()
        sock = raw_request(port, "/v1/generate", body)
        wait_for(lambda: metric(url, "gpt1_active_generations") == 1)
        sock.close()
        wait_for(lambda: metric(url, "gpt1_active_generations") == 0)
        assert generation_steps(url) < 50_000
        wait_for(
            lambda: metric(url, "gpt1_requests_total", '{code="499",endpoint="/v1/generate"}') == 1
        )
        assert post(f"{url}/v1/generate", {"prompt": "a", "max_new_tokens": 3}).status_code == 200


# -------------------------------------------------------------- tokenization off the loop
def test_health_answers_while_a_slow_tokenization_runs(world):
    """A tokenizer that blocks until /health has answered: on the event loop it would stall
    /health (and every other request) until it finished."""
    engine = load_engine(world["lm"])
    release, entered = threading.Event(), threading.Event()
    encode = engine.tokenizer.encode

    def slow_encode(text: str, *args: Any, **kw: Any) -> list[int]:
        entered.set()
        release.wait(60)
        return encode(text, *args, **kw)

    engine.tokenizer.encode = slow_encode
    results: dict[str, Any] = {}
    with serving(engine) as url:
        body = {"items": [{"context": "x" * 20_000, "continuation": "y"}]}
        t = threading.Thread(target=lambda: results.setdefault("r", post(f"{url}/v1/score", body)))
        t.start()
        assert entered.wait(TIMEOUT)
        try:
            health = httpx.get(f"{url}/health", timeout=20)  # would time out on a blocked loop
        finally:
            release.set()
        t.join(TIMEOUT)
    assert health.status_code == 200
    assert results["r"].status_code == 200, results["r"].text


def test_streamed_text_is_decoded_incrementally(world):
    """Each event's text comes from `TextStream` (one piece per token): the tokenizer's whole
    decode runs once, for the final event, not once per token (quadratic in the length)."""
    engine = load_engine(world["lm"])
    calls = []
    decode = engine.tokenizer.decode
    engine.tokenizer.decode = lambda ids: calls.append(len(ids)) or decode(ids)
    body = {"prompt": "the old man", "max_new_tokens": 40, "temperature": 0, "stream": True}
    with serving(engine) as url:
        events: list[dict] = []
        stream_events(url, body, events.append)
    *tokens, done = events
    assert len(tokens) == 40 and done["done"]
    assert "".join(e["text"] for e in tokens) == done["text"] == decode(done["ids"])
    assert calls == [40]


# ------------------------------------------------------------------------------- score
def test_score_refuses_a_continuation_longer_than_the_window(world):
    """A continuation longer than the scorer's window is refused naming the field and the
    limit (it used to be cut to the window silently); a long context keeps its last tokens and
    says how many."""
    with serving(world["lm"]) as url:
        window = load_engine(world["lm"]).scorer.n_positions
        long = post(
            f"{url}/v1/score",
            {"items": [{"context_ids": [5], "continuation_ids": [6] * (window + 8)}]},
        )
        fits = post(
            f"{url}/v1/score",
            {
                "items": [
                    {"context_ids": [5] * 100, "continuation_ids": [6] * 5},
                    {"context_ids": [5] * 3, "continuation_ids": [6] * window},
                ]
            },
        )
    assert long.status_code == 422
    assert (
        f"items.0.continuation: {window + 8} tokens, more than the {window}"
        in (long.json()["error"])
    )
    first, whole = fits.json()["results"]
    assert first["tokens"] == 5 and first["context_tokens"] == window - 5 + 1
    assert whole["tokens"] == window and whole["context_tokens"] == 1


# ------------------------------------------------------------------ slow and many clients
ANSWER_S = 30.0  # a held connection fails the test after this, not after TIMEOUT per socket


def test_half_sent_requests_time_out_with_408_and_one_log_line(world, caplog):
    """50 connections that send part of a request's headers, 10 that send nothing and 5 that
    stop half-way through the body: each is answered 408 and closed after the request timeout;
    the log says so in counted lines, not a traceback per connection."""
    caplog.set_level(logging.WARNING, logger="gpt1.serve")
    with serving(world["lm"], request_timeout=1.0) as url:
        port = int(url.rsplit(":", 1)[1])
        socks = [socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S) for _ in range(60)]
        for sock in socks[:50]:
            sock.sendall(b"POST /v1/score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        body = json.dumps({"items": [{"context": "a", "continuation": "b"}]}).encode()
        socks += [raw_request(port, "/v1/score", body, head_only=True) for _ in range(5)]
        for sock in socks:
            sock.settimeout(ANSWER_S)
        answers = [read_all(sock) for sock in socks]
        assert httpx.get(f"{url}/health", timeout=TIMEOUT).status_code == 200
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), {a[:40] for a in answers}
    assert b"request body not received within 1 s" in answers[-1]
    lines = [r for r in caplog.records if "within 1 s" in r.getMessage()]
    assert 1 <= len(lines) <= 4 and not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in caplog.text


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    with sock:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_connections_past_the_limit_get_503_at_once(world):
    """--max-connections 10: 25 idle connections; the 15 past the limit are answered 503 and
    closed at once (not held until the request timeout), the first 10 time out with 408."""
    with serving(world["lm"], max_connections=10, request_timeout=3.0) as url:
        port = int(url.rsplit(":", 1)[1])
        socks = [socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S) for _ in range(25)]
        answers = [read_all(sock) for sock in socks]
        assert httpx.get(f"{url}/health", timeout=TIMEOUT).status_code == 200
    statuses = sorted(a.split(b" ")[1].decode() for a in answers)
    assert statuses == ["408"] * 10 + ["503"] * 15


def test_accept_failures_are_counted_not_traced(caplog):
    """Out of file descriptors, asyncio logs a traceback per failed accept; the server's loop
    handler logs a counted line instead, and leaves other loop errors to the usual handler."""
    import asyncio
    import errno

    from gpt1.serve.connections import quiet_accept_errors

    caplog.set_level(logging.WARNING)
    loop = asyncio.new_event_loop()
    try:
        quiet_accept_errors(loop)
        for _ in range(1000):
            error = OSError(errno.EMFILE, "Too many open files")
            loop.call_exception_handler(
                {"message": "socket.accept() out of system resource", "exception": error}
            )
        loop.call_exception_handler({"message": "something else", "exception": ValueError("x")})
    finally:
        loop.close()
    accept = [r for r in caplog.records if "not accepted" in r.getMessage()]
    assert len(accept) == 1 and "Too many open files" in accept[0].getMessage()
    assert not accept[0].exc_info
    assert any("something else" in r.getMessage() for r in caplog.records)


def test_huge_or_deep_json_gets_a_422_and_edge_options_work(world):
    """JSON the parser gives up on (a 5,000-digit number, 100,000 open brackets) is a 422 as
    documented, not a generic 400; the smallest allowed sampling options and the largest seed
    generate."""
    digits = b"9" * 5000  # past Python's 4,300-digit limit for int()
    with serving(world["lm"]) as url:
        r = httpx.post(
            f"{url}/v1/generate",
            headers=JSON,
            content=b'{"prompt": "a", "seed": ' + digits + b"}",
            timeout=60,
        )
        deep = httpx.post(f"{url}/v1/generate", headers=JSON, content=b"[" * 100_000, timeout=60)
        openai = [
            httpx.post(f"{url}/v1/completions", headers=JSON, content=body, timeout=60)
            for body in (b'{"prompt": "a", "seed": ' + digits + b"}", b"[" * 100_000)
        ]
        edges = [
            post(f"{url}/v1/generate", {"prompt": "a", "max_new_tokens": 2, **option})
            for option in ({"temperature": 1e-4}, {"top_p": 1e-6}, {"seed": 2**64 - 1})
        ]
    assert r.status_code == 422 and r.json()["error"].startswith("body is not valid JSON: ")
    assert deep.status_code == 422
    assert deep.json()["error"] == "body is not valid JSON: nested too deeply"
    assert "sys." not in r.json()["error"] and "too many digits" in r.json()["error"]
    for answer in openai:  # OpenAI's error object on its routes, no Python advice
        error = answer.json()["error"]
        assert answer.status_code == 422 and error["type"] == "invalid_request_error", error
        assert error["message"].startswith("body is not valid JSON: ") and "sys." not in str(error)
    assert [e.status_code for e in edges] == [200] * 3, [e.text for e in edges]


def test_generations_decoded_together_default_by_precision():
    """An int8 model decodes up to 32 generations a step by default (its aggregate tokens/s
    grows to about there on 2 cores), the others 16; `--max-generations` sets it for all, and
    0 is refused."""
    from gpt1.errors import ConfigError
    from gpt1.serve.options import ServeOptions

    assert ServeOptions().generations_for("int8") == 32
    assert ServeOptions().generations_for("bf16") == ServeOptions().generations_for("fp32") == 16
    assert ServeOptions(max_generations=5).generations_for("int8") == 5
    with pytest.raises(ConfigError, match="--max-generations must be >= 1"):
        ServeOptions(max_generations=0)
