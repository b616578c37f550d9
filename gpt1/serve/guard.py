"""`Guard`, the middleware around the app: the gate (`gpt1.serve.security`: Host, Origin, API key,
Content-Type), bounds on a request body's size and arrival time, the one rule for clients that
leave, the headers every response carries, the request metrics, and the limits the app
validates bodies against.

**A client that leaves.** Whatever the route, once a request's body has arrived the client's
next message can only be its disconnect. The Guard waits for it beside the app: when it comes
first, every job the request queued (`gpt1.serve.batcher.request_jobs`: batches waiting, and
generations, stopped before their next decoding step) is cancelled, the app's work is
cancelled, and the request is counted with status 499 (nginx's "client closed request"), plain
or streamed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.responses import Response

from gpt1.serve.batcher import request_jobs
from gpt1.serve.connections import FloodLog
from gpt1.serve.metrics import Metrics
from gpt1.serve.openai.errors import refusal
from gpt1.serve.schemas import Limits, limits_in_force
from gpt1.serve.security import API_POLICY, SECURITY_HEADERS, Refusal, Security

log = logging.getLogger("gpt1.serve")
CLIENT_LEFT = 499


class Guard:
    """ASGI middleware (see the module docstring): `security`'s gate, body-size limit (413 before
    the body reaches the app), body-time limit (408 when the body has not arrived within
    `body_timeout` seconds), cancellation when the client leaves (499), request counts per
    endpoint of `endpoints` (any other path counts as "other"), latencies to the last byte and
    the in-flight gauge; the app validates the request against `limits` (`limits_in_force`).
    Refusals on `openai_paths` are OpenAI's error object."""

    def __init__(
        self,
        app: Any,
        metrics: Metrics,
        limits: Limits,
        endpoints: set[str],
        openai_paths: set[str],
        security: Security,
        body_timeout: float | None = None,
    ):
        self.app, self.metrics, self.limits, self.endpoints = app, metrics, limits, endpoints
        self.openai_paths, self.security = openai_paths, security
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
        send = self._with_headers(scope, send, status)
        try:
            await self._handle(scope, receive, send, status)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(endpoint, str(status["code"])).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - start)

    async def _handle(self, scope: dict, receive: Any, send: Any, status: dict) -> None:
        headers = dict(scope["headers"])
        refused = self.security.refusal(
            scope["method"], scope["path"], headers, scope.get("scheme", "http")
        )
        if refused is not None:
            await self._refuse(scope, refused)(scope, receive, send)
            return
        try:
            body = await asyncio.wait_for(self._read_body(headers, receive), self.body_timeout)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
            self.slow_bodies.count(timeout=self.body_timeout)
            message = f"request body not received within {self.body_timeout:g} s"
            late = Refusal(408, message, {"Connection": "close"})
            await self._refuse(scope, late)(scope, receive, send)
            return
        if body is None:
            too_big = Refusal(413, f"request body over {self.max_body} bytes", {})
            await self._refuse(scope, too_big)(scope, receive, send)
            return
        with limits_in_force(self.limits), request_jobs() as jobs:
            await self._run_unless_client_leaves(scope, body, receive, send, status, jobs)

    async def _run_unless_client_leaves(
        self, scope: dict, body: bytes, receive: Any, send: Any, status: dict, jobs: list
    ) -> None:
        """The app's answer, or, when the client disconnects first, its work cancelled (the
        module docstring's rule)."""
        gone = asyncio.Event()
        replay_sent = False

        async def replay() -> dict:
            # The app reads the body read already, then (only) the disconnect.
            nonlocal replay_sent
            if not replay_sent:
                replay_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        app = asyncio.ensure_future(self.app(scope, replay, send))
        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({app, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not gone.is_set():
            app.result()  # its exceptions are the server's to log
            return
        for job in jobs:
            job.cancelled.set()
        app.cancel()  # nothing when it has ended already
        try:
            await app
        except (asyncio.CancelledError, Exception) as exc:  # noqa: BLE001 - nobody to answer
            log.debug("%s after its client left: %r", scope["path"], exc)
        if not status.get("complete"):
            status["code"] = CLIENT_LEFT

    def _refuse(self, scope: dict, refused: Refusal) -> Any:
        """The response of a request refused before the app saw it, in the path's protocol."""
        if refused.status == 204:  # an allowed preflight: headers only
            return Response(status_code=204, headers=refused.headers)
        openai = scope["path"] in self.openai_paths
        return refusal(openai, refused.status, refused.message, refused.param, refused.headers)

    def _with_headers(self, scope: dict, send: Any, status: dict) -> Any:
        """`send`, adding to every response the security headers, an API policy where the
        response sets none, and CORS headers for an allowed cross-origin page; it records the
        status and whether the whole response went out."""
        cors = self.security.cors_headers(dict(scope["headers"]), scope.get("scheme", "http"))
        extra = {**SECURITY_HEADERS, **cors}
        encoded = [(k.lower().encode(), v.encode()) for k, v in extra.items()]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                have = {k.lower() for k, _ in message.get("headers", [])}
                added = [(k, v) for k, v in encoded if k not in have]
                if b"content-security-policy" not in have:
                    added.append((b"content-security-policy", API_POLICY.encode()))
                message = {**message, "headers": [*message.get("headers", []), *added]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                status["complete"] = True
            await send(message)

        return sending

    async def _read_body(self, headers: dict[bytes, bytes], receive: Any) -> bytes | None:
        """The whole body, or None once it passes the limit (by Content-Length or by count)."""
        length = headers.get(b"content-length")
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
