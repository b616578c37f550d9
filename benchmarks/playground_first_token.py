"""Time to the first streamed token: the playground page in headless Chromium against a Python
client (httpx, kept-alive connection) on the same `gpt1 serve`, requests taken in turns.

More rows say where the page's extra time goes: the page's Generate button clicked from the
page's own script, which then awaits the completion (`button.click()`, then the page's
`playground.running` promise: the same handler, and nothing else in the tab while the request
is in flight, where Playwright's `click` and its waiting run their own checks there), the same streamed request made by a bare
`fetch` loop in the same tab (the browser's transport without the page's code), and the
transport's floor, a GET of /health (no model work) from the tab against httpx.

A random GPT with a character vocabulary: the tests' tiny one (`--size tiny`) or GPT-1's shape
(`--size gpt1`: 12 layers of 768); greedy, 8 new tokens, prompt "the old man". Prints the
medians side by side. Needs Playwright and the system's Chromium (`apt-get install chromium`).

    python benchmarks/playground_first_token.py --size gpt1 --repeats 11
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_playground import (  # noqa: E402
    CHROMIUM_FLAGS,
    MAX_LOGPROBS,
    PROMPT,
    Page,
    api_first_token_ms,
    gpt1_serve,
)
from test_serve import tiny_lm  # noqa: E402

from helpers.tiny import char_vocab  # noqa: E402

SIZES = {"tiny": {}, "gpt1": {"n_embd": 768, "n_layer": 12, "n_head": 12}}

# The page's request, made by a bare fetch loop: milliseconds to the first event with text.
BARE_FETCH_TTFT = """async ([prompt, maxTokens, logprobs]) => {
  const body = {prompt, max_tokens: maxTokens, temperature: 0, stream: true, logprobs};
  const t0 = performance.now();
  const r = await fetch("/v1/completions", {method: "POST",
    headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const reader = r.body.getReader(), decoder = new TextDecoder();
  let first = null, buffer = "";
  for (;;) {
    const {done, value} = await reader.read();
    if (done) return first;
    buffer += decoder.decode(value, {stream: true});
    if (first === null && /"text": ?"[^"]/.test(buffer)) first = performance.now() - t0;
  }
}"""

# The transport's floor: a GET answered without the model, read to its end.
BARE_FETCH_HEALTH = """async () => {
  const t0 = performance.now();
  await (await fetch("/health")).text();
  return performance.now() - t0;
}"""


def health_ms(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    client.get(f"{url}/health").read()
    return 1000 * (time.perf_counter() - start)


def main() -> None:
    from playwright.sync_api import sync_playwright

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="gpt1")
    p.add_argument("--repeats", type=int, default=11)
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no Chromium installed (apt-get install chromium)")
    root = Path(tempfile.mkdtemp())
    lm = tiny_lm(root / "lm", char_vocab(root / "vocab"), n_positions=512, **SIZES[args.size])
    with gpt1_serve(lm) as url, sync_playwright() as pw, httpx.Client() as client:
        page = Page(pw.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS), url)
        api_first_token_ms(client, url, 8)  # warm both paths once
        page.complete(8, 0)
        rows: dict[str, list[float]] = {k: [] for k in ("page", "dom", "bare", "api", "hb", "ha")}
        for _ in range(args.repeats):
            page.complete(8, 0)
            rows["page"].append(page.js("playground.ttftMs"))
            rows["dom"].append(page.generate_from_script())
            rows["bare"].append(page.tab.evaluate(BARE_FETCH_TTFT, [PROMPT, 8, MAX_LOGPROBS]))
            rows["api"].append(api_first_token_ms(client, url, 8))
            rows["hb"].append(page.tab.evaluate(BARE_FETCH_HEALTH))
            rows["ha"].append(health_ms(client, url))
    m = {k: statistics.median(v) for k, v in rows.items()}
    print(f"size {args.size}, median of {args.repeats} greedy requests each, taken in turns")
    print(f"  first token, page (Playwright click):{m['page']:7.1f} ms")
    print(f"  first token, page (DOM click):      {m['dom']:7.1f} ms")
    print(f"  first token, bare fetch (Chromium): {m['bare']:7.1f} ms")
    print(f"  first token, API (httpx):           {m['api']:7.1f} ms")
    print(f"  GET /health, Chromium:              {m['hb']:7.1f} ms")
    print(f"  GET /health, httpx:                 {m['ha']:7.1f} ms")
    print(f"  ratio page / API:                   {m['page'] / m['api']:7.2f}")
    print(f"  ratio page (DOM click) / API:       {m['dom'] / m['api']:7.2f}")
    print(f"  ratio bare fetch / API:             {m['bare'] / m['api']:7.2f}")
    floor = m["hb"] - m["ha"]
    print(f"  the browser's transport adds:       {floor:7.1f} ms a request (/health)")
    print(f"  page (DOM click) / (API + that):    {m['dom'] / (m['api'] + floor):7.2f}")


if __name__ == "__main__":
    main()
