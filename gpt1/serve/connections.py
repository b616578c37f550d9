"""Connection limits for the HTTP server: requests must arrive in time, connections are bounded,
and floods are logged as one line now and then, never a traceback per connection.

uvicorn closes an idle keep-alive connection after a response, but a connection that opens and
sends nothing, or part of a request's headers, is held forever, each with a file descriptor.
`bounded_protocol(base, ...)` subclasses uvicorn's HTTP protocol class: a request's headers must
arrive within `request_timeout` seconds of the connection opening (or of their first byte on a
kept-alive connection), else the server answers 408 and closes it; past `max_connections` open
connections a new one is answered 503 and closed at once. The body's deadline is the app's
(`gpt1.serve.app.Guard`, 408 too). `quiet_accept_errors` turns asyncio's traceback per failed
`accept` (out of file descriptors) into the same kind of counted line.
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import time
from typing import Any

log = logging.getLogger("gpt1.serve")
FLOOD_LOG_EVERY_S = 10.0
LINGER_S = 1.0  # a refused connection's unread bytes are drained this long before it closes


class FloodLog:
    """Counts events of one kind and logs them at most once per `every` seconds, in one line
    (`<count> <message>`), so a flood of bad connections cannot flood the log."""

    def __init__(self, logger: logging.Logger, message: str, every: float = FLOOD_LOG_EVERY_S):
        self.logger, self.message, self.every = logger, message, every
        self.pending = 0
        self.last = -float("inf")

    def count(self, **fields: Any) -> None:
        self.pending += 1
        now = time.monotonic()
        if now - self.last >= self.every:
            self.logger.warning(
                "%d %s (counted since the last such line; logged at most every %g s)",
                self.pending,
                self.message.format(**fields),
                self.every,
            )
            self.pending, self.last = 0, now


def answer_and_close(
    transport: asyncio.WriteTransport,
    status: int,
    message: str,
    loop: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Write a whole JSON error response on a connection no request owns, then close it: at
    once, or (with `loop`) after sending end-of-file and a short linger, so that a client whose
    request bytes were never read gets the answer rather than a reset."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        + ("retry-after: 1\r\n" if status == 503 else "")
        + "connection: close\r\n\r\n"
    )
    transport.write(head.encode() + body)
    if loop is not None and transport.can_write_eof():
        transport.write_eof()
        loop.call_later(LINGER_S, transport.close)
    else:
        transport.close()


# uvicorn's HTTP protocol class (h11 or httptools), which `bounded_protocol` subclasses: its
# attributes (`connections`, `cycle`, `loop`, `transport`) are uvicorn's, untyped here.
UvicornProtocol = Any


def bounded_protocol(
    base: UvicornProtocol, request_timeout: float | None, max_connections: int | None
) -> type[asyncio.Protocol]:
    """`base` (uvicorn's h11 or httptools protocol) with a deadline for each request's headers
    and a bound on open connections (see the module docstring)."""
    within = f"within {request_timeout:g} s" if request_timeout is not None else ""
    late = FloodLog(log, f"connections closed: no complete request headers {within} (408)")
    refused = FloodLog(log, f"connections refused: over --max-connections {max_connections} (503)")

    class Bounded(base):
        _deadline: asyncio.TimerHandle | None = None
        _deadline_cycle: Any = None  # the request cycle when the deadline was armed
        _refused = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if max_connections is not None and len(self.connections) > max_connections:
                refused.count()
                self._refused = True
                answer_and_close(transport, 503, "too many connections; retry later", self.loop)
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # drained: this connection's requests are not read
            super().data_received(data)
            if self._deadline is not None and self.cycle is not self._deadline_cycle:
                self._disarm()  # a request's headers arrived whole: its app runs now
            elif self._deadline is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first bytes of the next request on a kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if request_timeout is None or self.transport.is_closing():
                return
            self._deadline_cycle = self.cycle
            self._deadline = self.loop.call_later(request_timeout, self._late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _late(self) -> None:
            self._deadline = None
            if self.transport.is_closing() or self.cycle is not self._deadline_cycle:
                return
            late.count()
            answer_and_close(self.transport, 408, f"request not received {within}")

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{base.__name__}"
    return Bounded


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log failed `accept`s (out of file descriptors, memory) as counted lines, not one
    traceback each; every other loop error goes to the handler there was."""
    flood = FloodLog(log, "connections not accepted: {error}")
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and "accept" in str(context.get("message", "")):
            flood.count(error=exc.strerror or exc)
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
