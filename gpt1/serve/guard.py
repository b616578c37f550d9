"""`Guard`, the middleware around the app: bounds on a request body's size and arrival time,
the request metrics, and the limits the app validates bodies against."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gpt1.serve.connections import FloodLog
from gpt1.serve.metrics import Metrics
from gpt1.serve.responses import error
from gpt1.serve.schemas import Limits, limits_in_force

log = logging.getLogger("gpt1.serve")


class Guard:
    """ASGI middleware: body-size limit (413 before the body reaches the app), body-time limit
    (408 when the body has not arrived within `body_timeout` seconds), request counts per
    endpoint of `endpoints` (any other path counts as "other"), latencies to the last byte and
    the in-flight gauge; the app validates the request against `limits` (`limits_in_force`)."""

    def __init__(
        self,
        app: Any,
        metrics: Metrics,
        limits: Limits,
        endpoints: set[str],
        body_timeout: float | None = None,
    ):
        self.app, self.metrics, self.limits, self.endpoints = app, metrics, limits, endpoints
        self.max_body, self.body_timeout = limits.max_body_bytes, body_timeout
        self.slow_bodies = FloodLog(log, "request bodies not received within {timeout:g} s (408)")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in self.endpoints else "other"
        status = {"code": 500}
        start = time.perf_counter()
        self.metrics.in_flight.inc()

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            try:
                body = await asyncio.wait_for(self._read_body(scope, receive), self.body_timeout)
            except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
                self.slow_bodies.count(timeout=self.body_timeout)
                await error(
                    408,
                    f"request body not received within {self.body_timeout:g} s",
                    {"Connection": "close"},
                )(scope, receive, counting_send)
                return
            if body is None:
                await error(413, f"request body over {self.max_body} bytes")(
                    scope, receive, counting_send
                )
                return
            if scope["method"] == "POST":
                # The API reads only JSON: a body sent as a form (curl -d's default type) is
                # read as JSON too, instead of failing with a puzzling message.
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = dict(scope, headers=headers + [(b"content-type", b"application/json")])
            with limits_in_force(self.limits):
                await self.app(scope, _replay(body, receive), counting_send)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(endpoint, str(status["code"])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)

    async def _read_body(self, scope: dict, receive: Any) -> bytes | None:
        """The whole body, or None once it passes the limit (by Content-Length or by count)."""
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI receive that gives the app the body read already, then the client's own
    messages (so a disconnect still reaches a streaming response)."""
    sent = {"done": False}

    async def replay() -> dict:
        if not sent["done"]:
            sent["done"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
