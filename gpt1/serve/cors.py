"""`--cors-origin ORIGIN`: let pages from other origins call the API from a browser.

A browser lets a page read a response from another origin only when the server says so (CORS);
`gpt1 serve` says so to none by default, and to the origins given, each exactly as a browser
sends it (`scheme://host[:port]`, no path), or `*` for any. The answers themselves (a preflight's,
the headers on every response to an allowed origin, the refusal of any other origin) are the
server's gate's (`gpt1.serve.security`); this module owns what an origin is.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from gpt1.errors import ConfigError

METHODS = "GET, POST"  # the API's methods; a preflight for any other is refused
ALLOWED_HEADERS = "Authorization, Content-Type"  # what a page sends beyond a simple request
MAX_AGE_S = 600  # how long a browser may reuse a preflight's answer

# A DNS name as a browser writes it in an Origin: labels of letters, digits and hyphens.
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def valid_hostname(name: str) -> bool:
    """Whether `name` is a host a browser could put in an Origin or Host header: a DNS name
    (lowercase labels), an IPv4 address, or an IPv6 address in brackets."""
    if name.startswith("[") and name.endswith("]"):
        try:
            return ipaddress.ip_address(name[1:-1]).version == 6
        except ValueError:
            return False
    return len(name) <= 253 and all(_LABEL.match(label) for label in name.split("."))


def check_origin(origin: str) -> str:
    """`origin` if a browser could send it as its Origin header (or `*`), else a ConfigError
    naming the option and what is expected."""
    if origin == "*":
        return origin
    parts = urlsplit(origin)
    try:
        port = parts.port  # reading it checks the port is a number in range
    except ValueError:
        port, parts = None, None
    well_formed = (
        parts is not None
        and parts.scheme in ("http", "https")
        and bool(parts.netloc)
        and valid_hostname(host_of(parts.netloc))
        and port != 0
        and not (parts.path or parts.query or parts.fragment or parts.username)
        and origin == f"{parts.scheme}://{parts.netloc}"
    )
    if not well_formed:
        raise ConfigError(
            f"--cors-origin {origin!r}: expected an origin as a browser sends it, "
            "scheme://host[:port] with a lowercase host name or address, a port in 1..65535, "
            "no wildcard, path or trailing slash (e.g. http://localhost:3000), or * alone for any"
        )
    return origin


def host_of(netloc: str) -> str:
    """The host part of `host[:port]` (an IPv6 address keeps its brackets)."""
    if netloc.startswith("["):
        return netloc[: netloc.find("]") + 1] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if ":" in netloc else netloc


def preflight_headers(origin: str, any_origin: bool) -> dict[str, str]:
    """The answer to an allowed origin's preflight (OPTIONS with Access-Control-Request-*)."""
    return {
        **response_headers(origin, any_origin),
        "Access-Control-Allow-Methods": METHODS,
        "Access-Control-Allow-Headers": ALLOWED_HEADERS,
        "Access-Control-Max-Age": str(MAX_AGE_S),
    }


def response_headers(origin: str, any_origin: bool) -> dict[str, str]:
    """What every response to an allowed cross-origin request carries, errors included."""
    if any_origin:
        return {"Access-Control-Allow-Origin": "*"}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
