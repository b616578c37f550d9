"""The playground's screenshot in the docs (docs/img/playground.png): `gpt1 serve CHECKPOINT` on a
free port, the page in the system's headless Chromium (Playwright), a sampled completion, the
pointer on one token to show its alternatives.

    python scripts/playground_screenshot.py runs/tiny/final docs/img/playground.png
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

import httpx
from playwright.sync_api import sync_playwright

FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"gpt1 serve exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    sys.exit("gpt1 serve did not start")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--prompt", default="to be or not")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "gpt1", "--quiet", "serve", args.checkpoint]
    proc = subprocess.Popen([*serve, "--port", str(port), "--threads", "1"])
    try:
        wait_up(url, proc)
        warm = {"prompt": args.prompt, "max_tokens": 1}  # loads the tokenizer (spaCy) once
        httpx.post(f"{url}/v1/completions", json=warm, timeout=120).raise_for_status()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=FLAGS)
            page = browser.new_page(viewport={"width": 1000, "height": 720})
            page.goto(url + "/")
            page.wait_for_function("window.playground && window.playground.ready")
            page.fill("#prompt", args.prompt)
            page.fill("#max-tokens", "22")
            page.fill("#temperature", "0.8")
            page.fill("#top-k", "40")
            page.fill("#seed", "1")
            page.click("#generate")
            page.wait_for_function("playground.state !== 'running'")
            if page.evaluate("playground.state") != "done":
                sys.exit(page.inner_text("#status"))
            page.hover("#out-text .tok >> nth=6")
            page.screenshot(path=args.out, full_page=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
