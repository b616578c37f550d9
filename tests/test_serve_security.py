"""The server's threat model (docs/commands/serve.md#security), rule by rule, against a real
uvicorn server: a foreign Host (DNS rebinding), a foreign Origin (a simple POST, a form), a body
that is not JSON, a missing or wrong API key, a client that leaves on every route, and the
headers every answer carries. Each refusal happens before any work (the metrics show no batch)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from test_serve import (  # noqa: E402
    TIMEOUT,
    kind_cases,
    serving,
    tiny_lm,
    tiny_run,
    wait_for,
)
from test_serve_limits import metric  # noqa: E402

from gpt1.errors import ConfigError  # noqa: E402
from gpt1.serve.schemas import Limits  # noqa: E402
from gpt1.serve.security import Security, check_allowed_host, page_policy  # noqa: E402
from helpers.tiny import char_vocab, run_cli  # noqa: E402

KEY = "s3cret-key-for-tests"
LONG = 4000  # tokens: a generation that runs for seconds (OpenAI's max_tokens must fit the window)
JSON = {"Content-Type": "application/json"}
GENERATE = {"prompt": "the old man", "max_new_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve_security")
    vocab = char_vocab(root / "vocab")
    task, spec, _, _ = kind_cases()["single"]
    return {
        "lm": tiny_lm(root / "lm", vocab),
        "long": tiny_lm(root / "long", vocab, n_positions=LONG + 8),  # room for a long generation
        "run": tiny_run(root / "run", vocab, task, spec),
    }


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def work_done(url: str) -> float:
    """Model batches and generated tokens so far: what a refused request must not add to."""
    return metric(url, "gpt1_generated_tokens_total") + sum(
        metric(url, "gpt1_batch_items_count", f'{{kind="{k}"}}') for k in ("score", "predict")
    )


# ------------------------------------------------------------------------------ Host
def test_a_loopback_server_answers_only_its_own_names(world):
    """DNS rebinding: a page of attacker.example whose name points at 127.0.0.1 sends
    Host: attacker.example; the server refuses it (403, naming the header) before any work.
    Its own names, with or without the port, and --allowed-host names are answered."""
    security = Security(allowed_hosts=("gpt1.internal",))
    with serving(world["lm"], security=security) as url:
        port = port_of(url)
        ok_hosts = ["localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"]
        ok_hosts += ["gpt1.internal", f"GPT1.internal:{port}"]
        answered = [
            httpx.post(f"{url}/v1/generate", json=GENERATE, headers={"Host": h}, timeout=TIMEOUT)
            for h in ok_hosts
        ]
        before = work_done(url)
        refused = {
            h: httpx.post(
                f"{url}/v1/completions", json=GENERATE, headers={"Host": h}, timeout=TIMEOUT
            )
            for h in ("attacker.example", f"attacker.example:{port}", "localhost:1", "127.0.0.2")
        }
        native = httpx.get(f"{url}/health", headers={"Host": "attacker.example"}, timeout=TIMEOUT)
        after = work_done(url)
    assert [r.status_code for r in answered] == [200] * len(ok_hosts)
    for host, r in refused.items():
        assert r.status_code == 403, (host, r.text)
        error = r.json()["error"]
        assert error["param"] == "Host" and "--allowed-host" in error["message"], error
    assert native.status_code == 403 and "Host" in native.json()["error"]
    assert after == before


def test_a_non_loopback_bind_answers_any_host_unless_names_are_given():
    anywhere = Security(bind_host="0.0.0.0")
    assert anywhere.host_allowed("box.lan:8000") and "any Host" in anywhere.describe()[0]
    assert anywhere.warnings() and "anyone who can reach" in anywhere.warnings()[0]
    named = Security(bind_host="0.0.0.0", allowed_hosts=("box.lan",), api_key=KEY)
    assert named.host_allowed("box.lan:8000") and not named.host_allowed("evil.example")
    assert not named.warnings()
    for bad in ("box.lan:8000", "BOX.lan", "a b", "*.lan", ""):
        with pytest.raises(ConfigError, match="--allowed-host"):
            check_allowed_host(bad)


# ---------------------------------------------------------------------- Origin and body
def test_cross_site_requests_are_refused_before_any_work(world):
    """What any web page can send without a preflight: a text/plain fetch, a form (url-encoded
    or enctype=text/plain holding valid JSON), each from a foreign Origin; and a body that is
    not declared JSON even from no Origin. None runs; the answers name the header."""
    body = json.dumps(GENERATE)
    with serving(world["lm"]) as url:
        before = work_done(url)
        foreign = {
            ctype: httpx.post(
                f"{url}/v1/generate",
                content=body,
                headers={"Origin": "http://evil.example", "Content-Type": ctype},
                timeout=TIMEOUT,
            )
            for ctype in ("text/plain", "application/x-www-form-urlencoded", "application/json")
        }
        untyped = {
            ctype: httpx.post(
                f"{url}/v1/completions", content=body, headers={"Content-Type": ctype}
            )
            for ctype in ("text/plain", "multipart/form-data; boundary=x", "application/jsonx")
        }
        bare = httpx.post(f"{url}/v1/generate", content=body, timeout=TIMEOUT)
        own = httpx.post(
            f"{url}/v1/generate",
            content=body,
            headers={"Origin": url, **JSON},
            timeout=TIMEOUT,
        )
        after = work_done(url)
        json_charset = httpx.post(
            f"{url}/v1/generate",
            content=body,
            headers={"Content-Type": "Application/JSON; charset=utf-8"},
            timeout=TIMEOUT,
        )
    for r in foreign.values():
        assert r.status_code == 403 and "Origin 'http://evil.example'" in r.json()["error"]
    for ctype, r in untyped.items():
        assert r.status_code == 415, (ctype, r.text)
        error = r.json()["error"]
        assert error["param"] == "Content-Type" and "application/json" in error["message"]
    assert bare.status_code == 415 and "Content-Type: none" in bare.json()["error"]
    assert own.status_code == 200, own.text
    assert after - before == 2  # the own-origin request's tokens, nothing else
    assert json_charset.status_code == 200


# ---------------------------------------------------------------------------- API key
def test_api_key_guards_every_route_but_health_and_the_pages(world):
    """With a key: 401 without it or with a wrong one (OpenAI's object on its routes, with
    WWW-Authenticate), 200 with it; /health, / and /docs stay open; the openai SDK's api_key=
    works."""
    from openai import AuthenticationError, OpenAI

    with serving(world["lm"], security=Security(api_key=KEY)) as url:
        missing = httpx.post(f"{url}/v1/completions", json={"prompt": "a"}, timeout=TIMEOUT)
        wrong = httpx.get(
            f"{url}/v1/models", headers={"Authorization": "Bearer nope"}, timeout=TIMEOUT
        )
        metrics = httpx.get(f"{url}/metrics", timeout=TIMEOUT)
        native = httpx.post(f"{url}/v1/generate", json=GENERATE, timeout=TIMEOUT)
        open_paths = {p: httpx.get(url + p, timeout=TIMEOUT).status_code for p in ("/health", "/")}
        keyed = httpx.post(
            f"{url}/v1/generate",
            json=GENERATE,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=TIMEOUT,
        )
        client = OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        text = client.completions.create(model="lm", prompt="the", max_tokens=2, temperature=0)
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=f"{url}/v1", api_key="wrong-key", max_retries=0).models.list()
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["param"] == "Authorization"
    assert wrong.status_code == 401 and metrics.status_code == 401 and native.status_code == 401
    assert "Authorization: Bearer" in native.json()["error"]
    assert open_paths == {"/health": 200, "/": 200}
    assert keyed.status_code == 200 and len(text.choices[0].text) > 0


def test_cli_takes_the_key_from_a_file_or_the_environment(world, tmp_path, monkeypatch):
    """--api-key-file's first line, $GPT1_API_KEY; a key too short, both flags, an unreadable
    file: one line each, before the model loads."""
    from gpt1.cli import build_parser
    from gpt1.cli.serve import api_key

    parse = build_parser().parse_args
    (tmp_path / "key").write_text(KEY + "\n")
    monkeypatch.setenv("GPT1_API_KEY", "from-the-env-123")
    assert api_key(parse(["serve", "x", "--api-key-file", str(tmp_path / "key")])) == KEY
    assert api_key(parse(["serve", "x"])) == "from-the-env-123"
    monkeypatch.delenv("GPT1_API_KEY")
    assert api_key(parse(["serve", "x"])) is None
    for argv, words in (
        (["--api-key", "short"], "at least 8"),
        (["--api-key", KEY, "--api-key-file", "k"], "not both"),
        (["--api-key-file", str(tmp_path)], "cannot read the key"),
        (["--allowed-host", "a.example:80"], "--allowed-host"),
        (["--cors-origin", "http://*.example.com"], "--cors-origin"),
        *[
            (["--host", bad], "--host")
            for bad in ("1e30", "inf", "", " ", "hôte", "no.such.host.invalid")
        ],
    ):
        code, err = run_cli(["serve", str(world["lm"]), *argv])
        assert code == 2 and words in err and len(err.splitlines()) == 1, (argv, err)


# ------------------------------------------------------------------------- disconnects
def send_and_leave(port: int, path: str, body: dict, until: Callable[[], bool]) -> None:
    """POST `body` on a raw socket, then, once `until()` holds, close it without reading the
    answer."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        sock.sendall(head.encode() + data)
        wait_for(until)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "the", "max_tokens": LONG}),
        ("/v1/completions", {"prompt": "the", "max_tokens": LONG, "stream": True}),
        ("/v1/generate", {"prompt": "the", "max_new_tokens": LONG}),
        ("/v1/generate", {"prompt": "the", "max_new_tokens": LONG, "stream": True}),
    ],
    ids=["completions", "completions-stream", "generate", "generate-stream"],
)
def test_a_generation_whose_client_leaves_stops_and_counts_499(world, path, body):
    """Plain or streamed, the generation stops within a step, frees its slot for the next
    request, and the request is counted as 499 (the openai SDK's retries after a time-out no
    longer pile up)."""
    limits = Limits(max_new_tokens=LONG)
    with serving(world["long"], limits=limits, max_generations=1) as url:
        port = port_of(url)
        send_and_leave(port, path, body, lambda: metric(url, "gpt1_generated_tokens_total") > 0)
        wait_for(lambda: metric(url, "gpt1_active_generations") == 0)
        tokens = metric(url, "gpt1_generated_tokens_total")
        label = f'{{code="499",endpoint="{path}"}}'
        wait_for(lambda: metric(url, "gpt1_requests_total", label) == 1)
        start = time.monotonic()
        nxt = httpx.post(f"{url}/v1/generate", json=GENERATE, timeout=TIMEOUT)
        waited = time.monotonic() - start
    assert nxt.status_code == 200
    assert tokens < LONG / 2, tokens
    print(f"\n{path} {body.get('stream', False)}: next request answered in {waited:.2f} s")


@pytest.mark.parametrize("path", ["/v1/score", "/v1/predict", "/v1/completions"])
def test_a_batched_request_whose_client_leaves_is_not_run(world, path):
    """A score, predict or scoring-completion request waiting for its batch (a long batch wait
    here) whose client leaves is dropped before the model runs it, and counted as 499."""
    bodies = {
        "/v1/score": {"items": [{"context": "the old", "continuation": "man"}]},
        "/v1/predict": {"inputs": {"text": "a fine film"}},
        "/v1/completions": {"prompt": "the old man", "max_tokens": 0, "echo": True, "logprobs": 1},
    }
    model = world["run"] if path == "/v1/predict" else world["lm"]
    with serving(model, batch_wait_ms=3000) as url:
        send_and_leave(
            port_of(url), path, bodies[path], lambda: metric(url, "gpt1_queue_items") == 1
        )
        label = f'{{code="499",endpoint="{path}"}}'
        wait_for(lambda: metric(url, "gpt1_requests_total", label) == 1)
        time.sleep(3.5)  # past the batch's wait: it would have run by now
        batches = sum(
            metric(url, "gpt1_batch_items_count", f'{{kind="{kind}"}}')
            for kind in ("score", "predict", "sequence_logprobs")
        )
    assert batches == 0


# ------------------------------------------------------------------------------ headers
def test_every_answer_carries_the_security_headers(world):
    """JSON answers, errors, the pages: nosniff, no framing, no referrer, and a policy; the
    pages' policy allows their own inline code by hash and this server only."""
    with serving(world["lm"]) as url:
        answers = {
            "health": httpx.get(f"{url}/health", timeout=TIMEOUT),
            "404": httpx.get(f"{url}/nope", timeout=TIMEOUT),
            "415": httpx.post(f"{url}/v1/generate", content="{}", timeout=TIMEOUT),
            "413": httpx.post(
                f"{url}/v1/generate", headers=JSON, content=b"x" * (2 << 20), timeout=TIMEOUT
            ),
            "page": httpx.get(f"{url}/", timeout=TIMEOUT),
            "docs": httpx.get(f"{url}/docs", timeout=TIMEOUT),
        }
    for name, r in answers.items():
        assert r.headers["x-content-type-options"] == "nosniff", name
        assert r.headers["x-frame-options"] == "DENY", name
        assert r.headers["referrer-policy"] == "no-referrer", name
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], name
    for page in ("page", "docs"):
        policy = answers[page].headers["content-security-policy"]
        assert policy == page_policy(answers[page].text)
        assert "script-src 'sha256-" in policy and "connect-src 'self'" in policy
        assert "unsafe" not in policy and "http" not in policy
    assert answers["health"].headers["content-security-policy"].startswith("default-src 'none'")


def test_the_pages_have_their_icon_without_a_key(world):
    """Browsers ask for /favicon.ico on every page (/docs logged a 404): it is served, to
    anyone, like the pages."""
    with serving(world["lm"], security=Security(api_key=KEY)) as url:
        icon = httpx.get(f"{url}/favicon.ico", timeout=TIMEOUT)
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.text.startswith("<svg")
