"""Who may use the server, and what a browser is told: the threat model of docs/commands/serve.md,
as one value (`Security`) and one check per request (`Security.refusal`).

A server on the loopback address is still reachable from every web page its user opens: a page
can send it requests (a form, a `text/plain` fetch: no preflight), and a page whose DNS name is
re-pointed at 127.0.0.1 (DNS rebinding) is even same-origin with it. So every request passes, in
this order, before any work:

1. **Host.** A loopback bind answers only Host values that name it (`localhost`, `127.0.0.1`,
   `[::1]`, the bound address; with or without its port) and the `--allowed-host` names: a
   rebound name is refused (403). A non-loopback bind is reachable by name anyway: it answers
   any Host unless `--allowed-host` names some.
2. **Origin.** A request carrying an Origin (every cross-site request a browser sends does) must
   come from the server's own origin or a `--cors-origin` one (403 otherwise, preflights and
   simple requests alike). Allowed cross-origin requests get CORS headers on every answer.
3. **API key.** With `--api-key`, every route but `/health` and the pages' static files needs
   `Authorization: Bearer KEY` (401 otherwise), compared in constant time.
4. **Content-Type.** A request with a body must say `application/json` (415 otherwise): a form or
   a `text/plain` body is what a cross-site page can send without asking.

Every response also carries headers that keep a browser from rendering an answer in a frame,
sniffing its type or sending the page's address on: `SECURITY_HEADERS`, and a
Content-Security-Policy (the pages' own, from `page_policy`, allows only their inline code and
this server).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import NamedTuple

from gpt1.errors import ConfigError
from gpt1.serve.cors import (
    check_origin,
    host_of,
    preflight_headers,
    response_headers,
    valid_hostname,
)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
# Routes any client may read without the key: liveness, and the pages with what they load
# (static: they hold no model output; the pages ask the key for everything else).
PUBLIC_PATHS = frozenset({"/health", "/", "/docs", "/openapi.json", "/favicon.ico"})
API_KEY_ENV = "GPT1_API_KEY"

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
# An API answer is data: nothing in it may run, load or be framed.
API_POLICY = "default-src 'none'; frame-ancestors 'none'"


class Refusal(NamedTuple):
    """A request refused before any work: status, one-line message, extra headers, the field
    (header) at fault."""

    status: int
    message: str
    headers: dict[str, str]
    param: str | None = None


@dataclass(frozen=True)
class Security:
    """The server's gate (the module docstring's rules). `bind_host`/`port`: where it listens;
    `allowed_hosts`: `--allowed-host` names (`*`: any Host); `cors_origins`: `--cors-origin`
    values; `api_key`: the key every non-public route needs (None: no key)."""

    bind_host: str = "127.0.0.1"
    port: int = 8000
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    api_key: str | None = None

    def __post_init__(self) -> None:
        check_bind_host(self.bind_host)
        for origin in self.cors_origins:
            check_origin(origin)
        for name in self.allowed_hosts:
            check_allowed_host(name)
        if self.api_key is not None:
            check_api_key(self.api_key)

    # ------------------------------------------------------------------------ the rules
    @property
    def loopback(self) -> bool:
        return is_loopback(self.bind_host)

    @property
    def any_host(self) -> bool:
        return "*" in self.allowed_hosts or (not self.loopback and not self.allowed_hosts)

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request's Host header names this server (None: no header, which no
        browser sends: HTTP/1.0 clients)."""
        if host is None or self.any_host:
            return True
        host = host.lower()
        name, port = host_of(host), host[len(host_of(host)) :]
        if port not in ("", f":{self.port}") and self.port != 0:  # 0: a port the system picks
            return False
        own = {*LOOPBACK_NAMES, bracketed(self.bind_host)} if self.loopback else set()
        return name in own or name in self.allowed_hosts

    def origin_allowed(self, origin: str, host: str | None, scheme: str) -> bool:
        """Whether a browser page of `origin` may use this server: its own origin (the Host it
        was reached by), or a `--cors-origin` one."""
        if host is not None and origin.lower() == f"{scheme}://{host.lower()}":
            return True
        return "*" in self.cors_origins or origin in self.cors_origins

    def cors_headers(self, headers: dict[bytes, bytes], scheme: str) -> dict[str, str]:
        """The CORS headers for a request from an allowed page of another origin (none for
        the server's own pages, requests without an Origin, or an origin it refuses)."""
        origin, host = _text(headers.get(b"origin")), _text(headers.get(b"host"))
        own = f"{scheme}://{(host or '').lower()}"
        if origin is None or origin.lower() == own or not self.origin_allowed(origin, host, scheme):
            return {}
        return response_headers(origin, "*" in self.cors_origins)

    def authorized(self, authorization: str | None) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        # compare_digest takes the same time wherever the strings differ.
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        )

    def refusal(
        self, method: str, path: str, headers: dict[bytes, bytes], scheme: str
    ) -> Refusal | None:
        """The `Refusal` of a request (the module docstring's order), or None to let it in."""
        host = _text(headers.get(b"host"))
        if not self.host_allowed(host):
            return Refusal(
                403,
                f"Host {host!r} is not a name of this server ({self.hosts_accepted()}); a "
                "page reaching it by another name is refused (start the server with "
                "--allowed-host NAME to accept one)",
                {},
                "Host",
            )
        origin = _text(headers.get(b"origin"))
        if origin is not None and not self.origin_allowed(origin, host, scheme):
            return Refusal(
                403,
                f"Origin {origin!r} may not use this server: only its own pages and "
                "--cors-origin origins may (start it with --cors-origin ORIGIN to allow one)",
                {},
                "Origin",
            )
        preflight = method == "OPTIONS" and b"access-control-request-method" in headers
        if preflight and origin is not None:
            cors = preflight_headers(origin, "*" in self.cors_origins)
            return Refusal(204, "", cors)  # answered here: a preflight carries no key
        if path not in PUBLIC_PATHS and not self.authorized(_text(headers.get(b"authorization"))):
            return Refusal(
                401,
                "this server needs an API key: send the header Authorization: Bearer KEY "
                "(the key given to gpt1 serve with --api-key, --api-key-file or $GPT1_API_KEY)",
                {"WWW-Authenticate": "Bearer"},
                "Authorization",
            )
        if has_body(method, headers) and not is_json(_text(headers.get(b"content-type"))):
            got = _text(headers.get(b"content-type"))
            return Refusal(
                415,
                f"Content-Type: {got or 'none'}; this API reads application/json only (send "
                "the header Content-Type: application/json; with curl: -H "
                "'Content-Type: application/json' or --json)",
                {},
                "Content-Type",
            )
        return None

    # ---------------------------------------------------------------------- what it says
    def hosts_accepted(self) -> str:
        if self.any_host:
            return "it answers any Host"
        names = [*LOOPBACK_NAMES, bracketed(self.bind_host)] if self.loopback else []
        names += [n for n in self.allowed_hosts if n not in names]
        listed = ", ".join(dict.fromkeys(names))
        return f"it answers {listed}, with or without :{self.port}"

    def describe(self) -> list[str]:
        """What the server accepts, for its start-up log (and warnings first)."""
        lines = [f"Host names: {self.hosts_accepted()}"]
        cors = ", ".join(self.cors_origins) or "none (its own pages only)"
        lines.append(f"browser origins besides its own: {cors}")
        lines.append("API key: " + ("required" if self.api_key else "none"))
        return lines

    def warnings(self) -> list[str]:
        out = []
        if not self.loopback and self.api_key is None:
            out.append(
                f"listening on {self.bind_host} with no API key: anyone who can reach this "
                "address can use the server (give --api-key-file FILE or $GPT1_API_KEY)"
            )
        return out


# ---------------------------------------------------------------------------- helpers
def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bracketed(host: str) -> str:
    """An address as it appears in a Host header (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host.lower()


def check_bind_host(host: str) -> str:
    """`--host`: an address of this machine or a name that resolves to one, refused in one line
    before the model loads (uvicorn would fail after it, with the resolver's words)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if valid_hostname(host.lower()):
        try:
            socket.getaddrinfo(host, None)
            return host
        except (OSError, UnicodeError):
            pass
    raise ConfigError(
        f"--host {host!r}: expected an address to listen on (127.0.0.1, 0.0.0.0, ::1, ...) or "
        "a name this machine resolves (localhost)"
    )


def check_allowed_host(name: str) -> str:
    """`--allowed-host NAME`: a host name or address (no port), or `*` for any."""
    if name == "*" or valid_hostname(bracketed(name).lower()) and name == name.lower():
        return name
    raise ConfigError(
        f"--allowed-host {name!r}: expected a lowercase host name or address as clients "
        "send it in the Host header, without a port (e.g. gpt1.example.org), or * for any"
    )


def check_api_key(key: str) -> str:
    """A key a client can send in a header: printable ASCII, no spaces, at least 8 characters."""
    if len(key) < 8 or not re.fullmatch(r"[\x21-\x7e]+", key):
        raise ConfigError(
            "--api-key: expected at least 8 printable ASCII characters with no spaces "
            f"(got {len(key)} characters)"
        )
    return key


def has_body(method: str, headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length", b"").strip()
    return method in ("POST", "PUT", "PATCH") and (
        b"transfer-encoding" in headers or (length not in (b"", b"0"))
    )


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json"


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def page_policy(html: str) -> str:
    """A page's Content-Security-Policy: its own inline scripts and styles (by hash) and this
    server; nothing from elsewhere, no frames, no forms."""
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    return "; ".join(
        [
            "default-src 'none'",
            "script-src " + " ".join(_hash(s) for s in scripts),
            "style-src " + " ".join(_hash(s) for s in styles),
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


def _hash(code: str) -> str:
    digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
    return f"'sha256-{digest}'"
