"""The playground page (`GET /`), CORS (`--cors-origin`) and streamed log-probabilities.

The browser tests drive a headless Chromium from the system's packages (Playwright for Python,
`executable_path`: no browser download) against a real `gpt1 serve` process on tiny random
models (test_serve's runs, `helpers.tiny`'s vocabulary). Expected values come from the API
itself (a plain greedy `/v1/completions` request) and from `gpt1 predict`. Without Chromium or
Playwright the browser tests skip with one line; `.ci/run` installs Chromium.

No timing assertion: the page's and the API's times to the first token are measured and
printed (`-s` shows them), never compared against a bound on a loaded machine.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from test_serve import (  # noqa: E402
    CHOICE_SPEC,
    TIMEOUT,
    free_port,
    kind_cases,
    post,
    serving,
    tiny_lm,
    tiny_run,
    wait_for,
    wait_until_serving,
    write_rows,
)
from test_serve_limits import metric  # noqa: E402

from gpt1.cli import build_parser, main  # noqa: E402
from gpt1.errors import ConfigError  # noqa: E402
from gpt1.serve.cors import check_origin  # noqa: E402
from gpt1.serve.openai.schemas import MAX_LOGPROBS, CompletionRequest  # noqa: E402
from gpt1.serve.playground import SAMPLING  # noqa: E402
from gpt1.serve.security import Security  # noqa: E402
from helpers.tiny import char_vocab, gpt1_process, run_cli, subprocess_env  # noqa: E402

PROMPT = "the old man"
WINDOW = 512  # the language model's positions: room for a generation long enough to stop
PAGE_LIMIT = 50_000  # bytes: the bound on the page
REPEATS = 11  # requests timed per side (medians: the machine is shared)
# Headless Chromium as root in a container: no sandbox, no GPU, nothing fetched in the background.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Names an attacker's page would use, pointed at this machine (as DNS rebinding does).
    "--host-resolver-rules=MAP attacker.example 127.0.0.1, MAP evil.example 127.0.0.1",
    # Chromium's own guard against public pages calling local addresses: off, so that the
    # tests show the server's answer to such a page (browsers without it are many).
    "--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,"
    "PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults",
]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Any]:
    """A language model with a 512-position window and two fine-tuned runs (single text, SST-2;
    multiple choice) with one test row each, all tiny and random."""
    root = tmp_path_factory.mktemp("playground")
    vocab = char_vocab(root / "vocab")
    world: dict[str, Any] = {"lm": tiny_lm(root / "lm", vocab, n_positions=WINDOW)}
    cases = kind_cases()
    for kind in ("single", "choice"):
        task, spec, fmt, rows = cases[kind]
        data = root / f"data_{kind}"
        write_rows(data / ("test.tsv" if task == "sst2" else f"test.{fmt}"), rows[:1], fmt)
        world[kind] = (tiny_run(root / f"run_{kind}", vocab, task, spec), data, rows[0])
    return world


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (the system's) under Playwright, or a skip saying what is missing."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install playwright)"
    )
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no Chromium installed (apt-get install chromium) for the browser tests")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@contextmanager
def gpt1_serve(model: Path, *options: str) -> Iterator[str]:
    """`gpt1 serve MODEL` as a process on a free loopback port, until the block ends."""
    port = free_port()
    argv = gpt1_process("serve", str(model), "--port", str(port), "--threads", "1", *options)
    proc = subprocess.Popen(
        argv, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, url)
        yield url
    finally:
        proc.terminate()
        proc.wait(TIMEOUT)


class Page:
    """A browser tab on a playground, recording console errors, uncaught exceptions and every
    request that leaves the page's origin."""

    def __init__(self, browser: Any, url: str, bypass_csp: bool = False, ready: bool = True):
        self.url = url
        # The page runs under its own Content-Security-Policy, as for a user, unless a test
        # uses it as a stand-in for another site's page (`bypass_csp`).
        self.tab = browser.new_page(bypass_csp=bypass_csp)
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.tab.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.tab.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.tab.on(
            "request",
            lambda r: r.url.startswith((url + "/", "data:")) or self.foreign.append(r.url),
        )
        self.tab.goto(url + "/")
        if ready:  # else the test waits itself (for the page to ask for a key, say)
            self.wait("window.playground && window.playground.ready")

    def js(self, expression: str) -> Any:
        return self.tab.evaluate(expression)

    def wait(self, expression: str) -> None:
        """Until `expression` is true in the tab. Polled from here: Playwright's own
        wait_for_function evaluates a string, which the page's policy forbids (no eval)."""
        wait_for(lambda: bool(self.js(expression)), poll=0.01)

    def generate_from_script(self) -> float:
        """Click Generate from the page's own script and await the completion there (the
        harness does nothing in the tab meanwhile); returns the page's time to first token."""
        return self.tab.evaluate(
            "async () => { document.getElementById('generate').click();"
            " await playground.running; return playground.ttftMs; }"
        )

    def complete(self, max_tokens: int, temperature: float) -> None:
        """Type the sampling options, click Generate, wait for the completion to finish."""
        self.tab.fill("#max-tokens", str(max_tokens))
        self.tab.fill("#temperature", str(temperature))
        self.tab.click("#generate")
        self.wait("playground.state !== 'running'")
        assert self.js("playground.state") == "done", self.tab.inner_text("#status")


def greedy(url: str, max_tokens: int) -> dict[str, Any]:
    """The API's own greedy choice for PROMPT, with the page's numbers of alternatives."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
    return post(f"{url}/v1/completions", {**body, "logprobs": MAX_LOGPROBS}).json()["choices"][0]


def api_first_token_ms(client: httpx.Client, url: str, max_tokens: int) -> float:
    """Milliseconds from sending a streamed greedy request (on `client`'s kept-alive
    connection, as the browser's) to its first text; the stream is read to its end."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["logprobs"] = MAX_LOGPROBS  # what the page asks for
    start, first = time.perf_counter(), None
    with client.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as r:
        for line in r.iter_lines():  # to the end, as the page reads it
            if first is None and line.startswith("data: {"):
                if json.loads(line[6:])["choices"][0]["text"]:
                    first = 1000 * (time.perf_counter() - start)
    assert first is not None, "no text in the stream"
    return first


def generated_tokens(url: str) -> float:
    """The server's count of generated tokens (`/metrics`)."""
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT).text
    return float(re.search(r"^gpt1_generated_tokens_total (\S+)$", text, re.M).group(1))


# ------------------------------------------------------------------- the page, no browser
def test_page_is_small_self_contained_and_off_with_no_playground(world):
    """GET / is the page: under 50 KB, no address outside the server, the sampling defaults
    of the completions body written in; `--no-playground` (with_playground=False) leaves / a
    404 in the API's words, and the CLI flag reaches the server's options."""
    with serving(world["lm"]) as url:
        page = httpx.get(url + "/", timeout=TIMEOUT)
    with serving(world["lm"], with_playground=False) as url:
        off = httpx.get(url + "/", timeout=TIMEOUT)
        models = httpx.get(url + "/v1/models", timeout=TIMEOUT)
    html = page.text
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert len(page.content) < PAGE_LIMIT
    assert not re.search(r"(https?:)?//[a-z0-9]", re.sub(r"<!--.*?-->", "", html)), "a URL"
    assert "@import" not in html and "url(" not in html
    config = json.loads(re.search(r'<script id="config" [^>]*>(.*?)</script>', html).group(1))
    fields = {f.alias or n: f for n, f in CompletionRequest.model_fields.items()}  # as sent
    assert config["defaults"] == {name: fields[name].default for name in SAMPLING}
    assert config["defaults"]["temperature"] == 1.0 and config["max_logprobs"] == MAX_LOGPROBS
    assert off.status_code == 404 and off.json() == {"error": "no such endpoint: / (see /docs)"}
    assert models.status_code == 200  # the API itself is untouched
    args = build_parser().parse_args(["serve", "run", "--no-playground"])
    assert args.playground is False and build_parser().parse_args(["serve", "r"]).playground


def test_streamed_logprobs_equal_the_plain_response(world):
    """`stream` with `logprobs` (the page's request): text chunks as they come, then the last
    chunk holds the choice's logprobs, equal to a plain request's; earlier chunks say null."""
    with serving(world["lm"]) as url:
        plain = greedy(url, 20)
        body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "stream": True}
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**body, "logprobs": 5}, timeout=TIMEOUT
        ) as r:
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line)["choices"][0] for line in lines[:-1]]
    assert "".join(c["text"] for c in chunks) == plain["text"] and len(chunks) > 10
    assert all(c["logprobs"] is None for c in chunks[:-1])
    last = chunks[-1]["logprobs"]
    assert last["tokens"] == plain["logprobs"]["tokens"]
    assert last["text_offset"] == plain["logprobs"]["text_offset"]
    assert last["token_logprobs"] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=1e-6)
    assert [sorted(t) for t in last["top_logprobs"]] == [
        sorted(t) for t in plain["logprobs"]["top_logprobs"]
    ]


# -------------------------------------------------------------------------------- CORS
def test_cors_origins_allowed_only_when_given(world):
    """A page of another origin is refused (403, before any work) by default, preflight and
    simple request alike; with --cors-origin the given origins (only those) pass the browser's
    preflight and get the header on every response, errors included; a malformed origin is
    refused in one line before anything loads."""
    allowed, other = "http://localhost:3000", "http://evil.example"
    preflight = {"Access-Control-Request-Method": "POST"}
    preflight["Access-Control-Request-Headers"] = "content-type"
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    with serving(world["lm"]) as url:
        plain = httpx.get(f"{url}/v1/models", headers={"Origin": allowed}, timeout=TIMEOUT)
        plain_pre = httpx.options(
            f"{url}/v1/completions", headers={"Origin": allowed, **preflight}, timeout=TIMEOUT
        )
    origins = (allowed, "https://app.example:8443")
    with serving(world["lm"], security=Security(cors_origins=origins)) as url:
        ok_pre = httpx.options(
            f"{url}/v1/completions", headers={"Origin": allowed, **preflight}, timeout=TIMEOUT
        )
        bad_pre = httpx.options(
            f"{url}/v1/completions", headers={"Origin": other, **preflight}, timeout=TIMEOUT
        )
        ok = post(f"{url}/v1/completions", body, headers={"Origin": allowed})
        refused = post(f"{url}/v1/completions", {"prompt": 3}, headers={"Origin": allowed})
        bad = post(f"{url}/v1/completions", body, headers={"Origin": other})
    assert plain.status_code == 403 and plain_pre.status_code == 403
    assert "access-control-allow-origin" not in plain.headers
    assert "access-control-allow-origin" not in plain_pre.headers
    assert "--cors-origin" in plain.json()["error"]["message"]
    assert ok_pre.status_code == 204
    assert ok_pre.headers["access-control-allow-origin"] == allowed
    assert "POST" in ok_pre.headers["access-control-allow-methods"]
    assert "authorization" in ok_pre.headers["access-control-allow-headers"].lower()
    assert bad_pre.status_code == 403 and "access-control-allow-origin" not in bad_pre.headers
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == allowed
    assert refused.status_code == 422 and refused.headers["access-control-allow-origin"] == allowed
    assert bad.status_code == 403 and "access-control-allow-origin" not in bad.headers
    assert check_origin("*") == "*" and check_origin("http://[::1]:8000") == "http://[::1]:8000"
    malformed = ["localhost:3000", "http://a.example/", "ftp://a.example", "http://a:99999"]
    malformed += ["http://*.example.com", "http://a b.example", "http://a.example:0", "*.a.com"]
    for origin in malformed:
        with pytest.raises(ConfigError, match="--cors-origin"):
            check_origin(origin)


def test_cli_refuses_a_malformed_cors_origin(world):
    code, err = run_cli(["serve", str(world["lm"]), "--cors-origin", "http://localhost:3000/app"])
    assert code == 2 and "--cors-origin 'http://localhost:3000/app'" in err
    assert len(err.splitlines()) == 1


# ----------------------------------------------------------------------------- browser
# Clicks Generate, then Stop once the first streamed token has arrived (checked every turn of
# the tab's event loop).
STOP_AT_FIRST_TOKEN = """() => new Promise(resolve => {
  document.getElementById("generate").click();
  const poll = () => {
    if (playground.events.length === 0) return setTimeout(poll, 0);
    document.getElementById("stop").click();
    resolve();
  };
  poll();
})"""


def test_browser_streams_greedy_completion_colours_tokens_and_stops(browser, world):
    """A real `gpt1 serve` and Chromium: the page loads with no console error and no request
    elsewhere, shows the model's description and the server's sampling defaults, streams a
    greedy completion event by event that equals the API's greedy answer, colours each token by
    the API's log-probability with the alternatives on hover, and Stop ends a long generation
    (the server stops it: no active generation, far fewer tokens than asked)."""
    with gpt1_serve(world["lm"]) as url:
        expected = greedy(url, 40)
        page = Page(browser, url)
        info = page.js(
            "Object.fromEntries([...document.querySelectorAll('#info dd')]"
            ".map(d => [d.id, d.textContent]))"
        )
        defaults = {name: page.tab.input_value(f"#{name.replace('_', '-')}") for name in SAMPLING}
        page.tab.fill("#prompt", PROMPT)
        page.complete(40, 0)
        shown = page.js("document.getElementById('out-text').textContent")
        events = page.js("playground.events")
        spans = page.js(
            "[...document.querySelectorAll('#out-text .tok')]"
            ".map(s => [s.textContent, Number(s.dataset.logprob)])"
        )
        page.tab.hover("#out-text .tok >> nth=3")
        tip = page.js(
            "[...document.querySelectorAll('#tip tr')].map(r => r.firstChild.textContent)"
        )
        tip_shown = page.tab.is_visible("#tip")

        before = generated_tokens(url)
        page.tab.fill("#max-tokens", str(WINDOW - 20))
        page.tab.fill("#temperature", "1")
        # Generate, then Stop as soon as the first token shows, both clicked from the tab's own
        # script: with Playwright's click (a few round trips to the tab) a loaded machine let
        # the tiny model write 481 of its 492 tokens before Stop arrived.
        page.tab.evaluate(STOP_AT_FIRST_TOKEN)
        page.wait("playground.state === 'stopped'")
        wait_for(
            lambda: httpx.get(f"{url}/health", timeout=TIMEOUT).json()["active_generations"] == 0
        )
        stopped_after = generated_tokens(url) - before
        assert not page.errors and not page.foreign, (page.errors, page.foreign)

    assert info["info-model"] == "lm" and info["info-window"] == f"{WINDOW} tokens"
    assert info["info-precision"] == "fp32" and info["info-kind"] == "language-model"
    fields = {f.alias or n: f for n, f in CompletionRequest.model_fields.items()}  # as sent
    for name, value in defaults.items():
        default = fields[name].default
        assert (value == "" and default is None) or float(value) == default, name
    assert shown == expected["text"] and len(expected["logprobs"]["tokens"]) == 40
    assert "".join(text for _, text in events) == expected["text"]
    assert len(events) > 20 and len({t for t, _ in events}) > 1  # piece by piece, over time
    lp = expected["logprobs"]
    assert [s[1] for s in spans] == pytest.approx(lp["token_logprobs"], abs=1e-6)
    assert "".join(s[0] for s in spans) == shown[lp["text_offset"][0] :]
    assert tip_shown and tip[0] == json.dumps(lp["tokens"][3])
    assert {json.loads(t) for t in tip} == set(lp["top_logprobs"][3]) | {lp["tokens"][3]}
    print(f"\nStop after the first token: {stopped_after:.0f} of {WINDOW - 20} tokens generated")
    assert 0 < stopped_after < WINDOW - 20 - 20, stopped_after


def test_browser_first_token_time_against_the_api(browser, world):
    """Time to the first streamed token, in the page (fetch to first text; and to the response
    headers), clicked by Playwright and from the page's own script (Playwright's click runs its
    own checks in the tab while the request is in flight), and from Python (httpx on a
    kept-alive connection), REPEATS greedy requests each, taken in turns on the same server:
    printed, not asserted."""
    with gpt1_serve(world["lm"]) as url, httpx.Client() as client:
        page = Page(browser, url)
        api_first_token_ms(client, url, 8)  # warm both paths once
        page.complete(8, 0)
        clicked, own, headers, api = [], [], [], []
        for _ in range(REPEATS):
            page.complete(8, 0)
            clicked.append(page.js("playground.ttftMs"))
            headers.append(page.js("playground.headersMs"))
            own.append(page.generate_from_script())
            api.append(api_first_token_ms(client, url, 8))
        assert not page.errors
        assert page.js("playground.state") == "done"
    clicked_ms, own_ms, api_ms = (statistics.median(v) for v in (clicked, own, api))
    print(
        f"\ntime to first token (median of {REPEATS}, tiny model): page {own_ms:.1f} ms "
        f"(clicked by Playwright {clicked_ms:.1f} ms, headers {statistics.median(headers):.1f} "
        f"ms), API {api_ms:.1f} ms, ratio {own_ms / api_ms:.2f}"
    )
    assert all(ms > 0 for ms in clicked + own + api)
    assert all(h <= t for h, t in zip(headers, clicked))


@pytest.mark.parametrize("kind", ["single", "choice"])
def test_browser_classifier_form_equals_gpt1_predict(browser, world, kind, tmp_path):
    """A fine-tuned run's page has a form of the task's own fields; its answer shows the
    probabilities `gpt1 predict --format jsonl` writes for the same input (per label, or per
    choice for multiple choice)."""
    run, data, row = world[kind]
    assert main(["--quiet", "predict", str(run), "--data", str(data), "--format", "jsonl",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    (written,) = tmp_path.glob("*.jsonl")
    record = json.loads(written.read_text().splitlines()[0])
    expected = record["probabilities"]
    with gpt1_serve(run) as url:
        page = Page(browser, url)
        fields = page.js(
            "[...document.querySelectorAll('#predict-fields textarea')].map(t => t.dataset.field)"
        )
        values = {"text": row["sentence"]} if kind == "single" else row
        for name in fields:
            value = values.get(name, "")
            page.tab.fill(f"#field-{name}", "\n".join(value) if isinstance(value, list) else value)
        page.tab.click("#predict-button")
        page.tab.wait_for_selector("#predict-result td.p")
        shown = page.js(
            "[...document.querySelectorAll('#predict-result td.p')]"
            ".map(td => [td.dataset.name, Number(td.dataset.p)])"
        )
        label = page.tab.inner_text("#predict-label strong")
        raw = page.js("document.querySelector('#predict-label').dataset.label")
        assert not page.errors and not page.foreign, (page.errors, page.foreign)
    if kind == "single":  # SST-2: the class's name, its raw label beside it
        assert fields == ["text"]
        assert dict(shown) == pytest.approx(expected, abs=1e-6)
        assert raw == record["label"] == max(expected, key=expected.get)
        assert label == record["label_name"] == {"0": "negative", "1": "positive"}[raw]
    else:
        columns = CHOICE_SPEC["columns"]
        assert fields == [columns["context"], columns["choices"]]
        assert [name for name, _ in shown] == row["endings"]
        assert [p for _, p in shown] == pytest.approx(expected, abs=1e-6)


def test_browser_cors_lets_only_the_given_origin_read(browser, world):
    """From a playground page (origin A), fetch() reads a server started with
    --cors-origin A, and is blocked by the browser on a server started without it."""
    with serving(world["lm"]) as page_url:
        with (
            serving(world["lm"], security=Security(cors_origins=(page_url,))) as open_url,
            serving(world["lm"]) as closed_url,
        ):
            page = Page(browser, page_url, bypass_csp=True)  # its own policy allows no other
            read = page.js(
                f"fetch('{open_url}/v1/models').then(r => r.json()).then(j => j.data[0].id)"
            )
            blocked = page.js(f"fetch('{closed_url}/v1/models').then(() => 'read', e => e.name)")
    assert read == "lm" and blocked == "TypeError"


# ------------------------------------------------------------------- browser: attacks
def test_browser_rebinding_page_cannot_read_the_server(browser, world):
    """DNS rebinding in a real browser: a page served as http://attacker.example:PORT/ (its name
    then resolving to 127.0.0.1, where gpt1 serves on PORT) is same-origin with the server, so
    the browser lets it read any answer; the server refuses its Host (403) before any work."""
    with serving(world["lm"]) as url:
        port = url.rsplit(":", 1)[1]
        origin = f"http://attacker.example:{port}"
        tab = browser.new_page()
        # The attacker's own page, as its server sent it before the name was re-pointed.
        tab.route(
            origin + "/",
            lambda route: route.fulfill(body="<html><body>attacker</body></html>"),
        )
        tab.goto(origin + "/")
        statuses = tab.evaluate(
            """async () => {
              const models = await fetch('/v1/models');
              const made = await fetch('/v1/completions', {method: 'POST',
                headers: {'Content-Type': 'application/json'},
                body: JSON.stringify({prompt: 'the old man', max_tokens: 5})});
              return [models.status, made.status, (await made.json()).error.param];
            }"""
        )
        tokens = generated_tokens(url)
        tab.close()
    assert statuses == [403, 403, "Host"]
    assert tokens == 0


def test_browser_cross_site_form_cannot_make_the_server_work(browser, world):
    """A page on another site submits a form to the local server, enctype=text/plain with a
    field that makes the body valid JSON (no preflight for a form): refused for its Origin
    and its type, nothing generated."""
    with serving(world["lm"]) as url:
        page_url = "http://evil.example:9/form"
        form = (
            f'<form method="POST" action="{url}/v1/generate" enctype="text/plain">'
            '<input name=\'{"prompt": "the old man", "max_new_tokens": 5, "x": "\' value=\'"}\'>'
            "</form><script>document.forms[0].submit()</script>"
        )
        tab = browser.new_page()
        tab.route(page_url, lambda route: route.fulfill(body=form, content_type="text/html"))
        with tab.expect_navigation(url=f"{url}/v1/generate"):
            tab.goto(page_url)
        answer = tab.inner_text("body")
        tokens = generated_tokens(url)
        refused = metric(url, "gpt1_requests_total", '{code="403",endpoint="/v1/generate"}')
        tab.close()
    assert "Origin 'http://evil.example:9' may not use this server" in answer
    assert tokens == 0 and refused == 1


def test_browser_playground_asks_for_the_key_once_and_keeps_it_in_the_tab(browser, world):
    """With --api-key the page shows a key form (the info it needs is behind the key), then,
    given the key, describes the model and completes; the key is in no storage."""
    key = "browser-test-key-1"
    with gpt1_serve(world["lm"], "--api-key", key) as url:
        page = Page(browser, url, ready=False)
        page.tab.wait_for_selector("#key-section", state="visible")
        asked = page.tab.inner_text("#status")
        page.tab.fill("#api-key", key)
        page.tab.click("#key-form button")
        page.wait("window.playground && window.playground.ready")
        model = page.js("document.getElementById('info-model').textContent")
        page.tab.fill("#prompt", PROMPT)
        page.complete(5, 0)
        stored = page.js("[localStorage.length, sessionStorage.length, document.cookie]")
        page.tab.close()
    assert "needs an API key" in asked
    assert model == "lm" and stored == [0, 0, ""]
    assert not page.errors or all("401" in e for e in page.errors), page.errors
