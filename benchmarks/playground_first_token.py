"""Time to the first streamed token: the playground page in headless Chromium against a Python
client (httpx, kept-alive connection) on the same `gpt1 serve`, requests taken in turns.

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
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_playground import CHROMIUM_FLAGS, Page, api_first_token_ms, gpt1_serve  # noqa: E402
from test_serve import tiny_lm  # noqa: E402

from helpers.tiny import char_vocab  # noqa: E402

SIZES = {"tiny": {}, "gpt1": {"n_embd": 768, "n_layer": 12, "n_head": 12}}


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
        in_page, api = [], []
        for _ in range(args.repeats):
            page.complete(8, 0)
            in_page.append(page.js("playground.ttftMs"))
            api.append(api_first_token_ms(client, url, 8))
    page_ms, api_ms = statistics.median(in_page), statistics.median(api)
    print(f"size {args.size}, median of {args.repeats} greedy requests each")
    print(f"  first token, page (Chromium): {page_ms:7.1f} ms")
    print(f"  first token, API (httpx):     {api_ms:7.1f} ms")
    print(f"  ratio page / API:             {page_ms / api_ms:7.2f}")


if __name__ == "__main__":
    main()
