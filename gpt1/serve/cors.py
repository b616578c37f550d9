"""`--cors-origin ORIGIN`: let pages from other origins call the API from a browser.

A browser lets a page read a response from another origin only when the server says so (CORS);
`gpt1 serve` says so to none by default, and to the origins given, each exactly as a browser
sends it (`scheme://host[:port]`, no path), or `*` for any. Starlette's `CORSMiddleware` answers
the preflight requests and adds the headers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from gpt1.errors import ConfigError

METHODS = ["GET", "POST"]  # the API's methods; a preflight for any other is refused


def check_origin(origin: str) -> str:
    """`origin` if a browser could send it as its Origin header (or `*`), else a ConfigError
    naming the option and what is expected."""
    if origin == "*":
        return origin
    parts = urlsplit(origin)
    try:
        parts.port  # noqa: B018 (reading it checks the port is a number in range)
    except ValueError:
        parts = None
    well_formed = (
        parts is not None
        and parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and not (parts.path or parts.query or parts.fragment or parts.username)
        and origin == f"{parts.scheme}://{parts.netloc}"
    )
    if not well_formed:
        raise ConfigError(
            f"--cors-origin {origin!r}: expected an origin as a browser sends it, "
            "scheme://host[:port] with no path or trailing slash (e.g. http://localhost:3000), "
            "or * for any"
        )
    return origin


def add_cors(app: Any, origins: Sequence[str]) -> None:
    """Allow browser requests to `app` (a FastAPI app) from `origins` (none: nothing added)."""
    if not origins:
        return
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(
        CORSMiddleware,
        allow_origins=[check_origin(o) for o in origins],
        allow_methods=METHODS,
        allow_headers=["*"],
        max_age=600,
    )
