"""The HTTP API (FastAPI): /v1/predict, /v1/generate, /v1/score, /health, /metrics, /docs, and
the OpenAI-compatible endpoints of `gpt1.serve.completions` (/v1/completions, /v1/models, ...).

Every error is JSON `{"error": "<one line>"}` with a 4xx status for a bad request (422: invalid
body, 413: body too large, 408: body not sent in time, 404: unknown path or an endpoint this
model does not serve), 503 with `Retry-After` when the queue is full, 500 (logged with its
traceback) for a bug. The model runs in the batcher's worker thread and tokenization in a
tokenizer thread, so the event loop only validates and waits: a long text never stalls the
other requests. A generation whose client leaves (a dropped stream or a plain request) is
stopped before the next decoding step.
"""

# No `from __future__ import annotations`: FastAPI reads the body types of the handlers below,
# which are local classes, from their evaluated annotations.
import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from gpt1.errors import Gpt1Error
from gpt1.serve.batcher import Batcher, Job, QueueFull
from gpt1.serve.completions import PATHS as COMPLETION_PATHS
from gpt1.serve.completions import SCORE_KIND, completions_router
from gpt1.serve.connections import FloodLog, quiet_accept_errors
from gpt1.serve.docs_page import docs_page
from gpt1.serve.engine import Engine, GenerationRequest
from gpt1.serve.metrics import Metrics
from gpt1.serve.schemas import (
    ERROR_RESPONSES,
    Limits,
    generate_model,
    predict_model,
    score_model,
)

log = logging.getLogger("gpt1.serve")
RETRY_AFTER_S = 1


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    """Pydantic's errors as one line: `inputs.0.text: Field required; ...`, each field named as
    the client sent it (`inputs.text` when `inputs` was one object, which the schema validates
    as a list of one)."""
    body = getattr(exc, "body", None)
    one_item = isinstance(body, dict) and isinstance(body.get("inputs"), dict)
    parts = []
    for e in exc.errors():
        where = [p for p in e.get("loc", ()) if p != "body"]
        if one_item and where[:2] == ["inputs", 0]:
            where = ["inputs", *where[2:]]
        loc = ".".join(str(p) for p in where)
        if e.get("type") == "json_invalid":
            parts.append("body is not valid JSON")
            continue
        msg = e.get("msg", "invalid").replace("Value error, ", "")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts[:5]) + (f" (and {len(parts) - 5} more)" if len(parts) > 5 else "")


class Guard:
    """ASGI middleware: body-size limit (413 before the body reaches the app), body-time limit
    (408 when the body has not arrived within `body_timeout` seconds), request counts,
    latencies to the last byte and the in-flight gauge."""

    def __init__(
        self, app: Any, metrics: Metrics, max_body_bytes: int, body_timeout: float | None = None
    ):
        self.app, self.metrics, self.max_body = app, metrics, max_body_bytes
        self.body_timeout = body_timeout
        self.slow_bodies = FloodLog(log, "request bodies not received within {timeout:g} s (408)")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in KNOWN_PATHS else "other"
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


KNOWN_PATHS = {"/v1/predict", "/v1/generate", "/v1/score", "/health", "/metrics"} | COMPLETION_PATHS


def create_app(
    engine: Engine,
    limits: Limits | None = None,
    batch_tokens: int = 8192,
    batch_items: int = 16,
    wait_s: float = 0.002,
    max_queue: int = 1024,
    max_generations: int = 16,
    request_timeout: float | None = None,
) -> Any:
    """The ASGI app serving `engine` (wrapped in the `Guard` middleware; `request_timeout`
    bounds the seconds a request body may take to arrive)."""
    limits = limits or Limits()
    metrics = Metrics()
    # Tokenization runs here, off the event loop, so a long text never stalls other requests;
    # one thread, because the tokenizer (its caches, spaCy) is not made for concurrent calls.
    tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="gpt1-tokenize")

    async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in the tokenizer thread (its exceptions are raised here)."""
        return await asyncio.get_running_loop().run_in_executor(tokenizer_thread, fn, *args)

    def run_batch(kind: str, items: list[Any]) -> list[Any]:
        if kind == "predict":
            return engine.predict(items, micro=batch_items)
        if kind == SCORE_KIND:  # the OpenAI-compatible endpoints' scoring
            return engine.sequence_logprobs(items)
        return engine.score(items)

    batcher = Batcher(
        run_batch,
        batch_tokens,
        batch_items,
        wait_s,
        max_queue,
        max_generations,
        on_batch=metrics.observe_batch,
        generations=engine.generations,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        quiet_accept_errors(asyncio.get_running_loop())
        batcher.start()
        log.info("gpt1 serve: %s ready", engine.folder)
        yield
        batcher.stop()  # uvicorn has already let the requests in flight finish
        tokenizer_thread.shutdown(wait=False)

    app = FastAPI(
        title="gpt1",
        version="1",
        lifespan=lifespan,
        description="GPT-1 inference: predict with a fine-tuned run, generate and "
        'score with a language model. Errors are {"error": "..."}.',
        docs_url=None,  # served below without a CDN
        redoc_url=None,
    )
    app.state.engine, app.state.batcher, app.state.metrics = engine, batcher, metrics
    app.state.off_loop = off_loop

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, _validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.__cause__ is not None:  # JSON the parser gave up on
            return error(422, f"body is not valid JSON: {_parse_failure(exc.__cause__)}")
        if exc.status_code == 404 and request.url.path == "/v1/predict":
            return error(
                404,
                "this model is a pretrained language model: /v1/predict needs a "
                "fine-tuned run (use /v1/generate or /v1/score)",
            )
        if exc.status_code == 404:
            return error(404, f"no such endpoint: {request.url.path} (see /docs)")
        if exc.status_code == 405:
            return error(
                405,
                f"{request.method} is not allowed on {request.url.path}",
                getattr(exc, "headers", None),
            )
        return error(exc.status_code, exc.detail, getattr(exc, "headers", None))

    @app.exception_handler(Gpt1Error)
    async def user_error(request: Request, exc: Gpt1Error) -> JSONResponse:
        return error(422, str(exc))

    @app.exception_handler(QueueFull)
    async def busy(request: Request, exc: QueueFull) -> JSONResponse:
        return error(503, f"server busy: {exc}; retry later", {"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return error(500, f"internal error: {type(exc).__name__}: {exc}")

    async def submit(kind: str, payload: Any, tokens: int, items: int) -> Any:
        loop = asyncio.get_running_loop()
        job = Job(kind, payload, tokens, items, loop, future=loop.create_future())
        batcher.submit(job)
        metrics.queued.set(batcher.queued_items)
        return await job.future

    PredictRequest = predict_model(engine.fields, limits) if engine.task is not None else None
    GenerateRequest = generate_model(limits)
    ScoreRequest = score_model(limits)

    app.include_router(
        completions_router(engine, batcher, metrics, limits, off_loop, _validation_message)
    )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness and what is being served."""
        return {
            "status": "ok",
            **engine.describe(),
            "queued_items": batcher.queued_items,
            "active_generations": batcher.active_generations,
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        """Prometheus text format."""
        metrics.queued.set(batcher.queued_items)
        metrics.active_generations.set(batcher.active_generations)
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(docs_page(app.title))

    async def predict(body: PredictRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        """Label (or score) and probabilities per item, exactly as `gpt1 predict` computes them."""
        items = [item.model_dump(by_alias=True) for item in body.inputs]
        encoded = await off_loop(lambda: engine.encode(engine.examples(items)))
        tokens = sum(len(seq) for item in encoded for seq in item)
        preds = await submit("predict", encoded, tokens, len(encoded))
        return {
            "predictions": [
                p.as_dict(engine.task.labels if engine.task.kind != "choice" else None)
                for p in preds
            ]
        }

    if engine.task is not None:  # a language model has no task to predict
        app.post("/v1/predict", responses=ERROR_RESPONSES)(predict)

    @app.post("/v1/score", responses=ERROR_RESPONSES)
    async def score(body: ScoreRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        """Log-probability of each continuation's tokens given its context (zero-shot scorer)."""
        pairs = await off_loop(lambda: [_score_pair(engine, it) for it in body.items])
        window = engine.scorer.n_positions
        for n, (ctx, cont) in enumerate(pairs):
            if not ctx or not cont:
                return error(
                    422, f"items.{n}: the {'context' if not ctx else 'continuation'} has no tokens"
                )
            if len(cont) > window:  # scored whole or not at all, never cut
                return error(
                    422,
                    f"items.{n}.continuation: {len(cont)} tokens, more than the {window} this "
                    "model scores in one window",
                )
        tokens = sum(len(c) + len(x) for c, x in pairs)
        return {"results": await submit("score", pairs, tokens, len(pairs))}

    @app.post("/v1/generate", response_model=None, responses=ERROR_RESPONSES)
    async def generate(body: GenerateRequest, request: Request) -> Any:  # type: ignore[valid-type]
        """Continue a prompt (gpt1 sample's options); `"stream": true` sends server-sent events."""
        prompt = await off_loop(engine.token_ids, body.prompt, body.prompt_ids, "prompt")
        if not prompt:
            return error(422, "prompt: no tokens after tokenization")
        if len(prompt) > engine.n_positions:
            return error(
                422,
                f"prompt: {len(prompt)} tokens, more than the model's "
                f"{engine.n_positions} positions",
            )
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue = asyncio.Queue()
        job = Job(
            "generate",
            GenerationRequest(
                prompt, body.max_new_tokens, body.temperature, body.top_k, body.top_p, body.seed
            ),
            len(prompt),
            1,
            loop,
            emit=tokens.put_nowait,
        )
        batcher.submit(job)

        async def new_tokens() -> AsyncIterator[int]:
            try:
                while True:
                    item = await tokens.get()
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    metrics.generated.inc()
                    yield item
            finally:
                job.cancelled.set()  # no-op when finished; frees the worker if the client left

        if body.stream:
            return GenerationStream(_events(engine, prompt, new_tokens()), job)
        ids = await _unless_client_leaves(_collect(new_tokens()), request)
        if ids is None:  # nobody to answer; the generation is stopped already
            return Response(status_code=CLIENT_LEFT)
        return {"text": engine.decode(ids), "ids": ids, "prompt_ids": prompt}

    return Guard(app, metrics, limits.max_body_bytes, request_timeout)


CLIENT_LEFT = 499  # nginx's "client closed request": the metrics count such requests apart


def _parse_failure(cause: BaseException) -> str:
    """Why JSON that the parser rejected (not a syntax error) failed, in a few words."""
    if isinstance(cause, RecursionError):
        return "nested too deeply"
    return " ".join(str(cause).split()) or type(cause).__name__


def _score_pair(engine: Engine, item: Any) -> tuple[list[int], list[int]]:
    return (
        engine.token_ids(item.context, item.context_ids, "context"),
        engine.token_ids(item.continuation, item.continuation_ids, "continuation"),
    )


async def _collect(tokens: AsyncIterator[int]) -> list[int]:
    return [t async for t in tokens]


async def _unless_client_leaves(work: Any, request: Request) -> Any:
    """The result of the coroutine `work`, or None when the client disconnects first (then
    `work` is cancelled, which stops its generation)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        return None
    return task.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone (the body was read already: the next message is the
    disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class GenerationStream(StreamingResponse):
    """Server-sent events of one generation, which stops as soon as the response ends, however
    it ends (finished, or the client gone): no decoding for nobody."""

    def __init__(self, events: AsyncIterator[str], job: Job):
        super().__init__(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancelled.set()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def _events(
    engine: Engine, prompt: list[int], tokens: AsyncIterator[int]
) -> AsyncIterator[str]:
    """Server-sent events: one `data: {"id", "text"}` per token (`text` is what it adds to the
    decoded continuation, decoded incrementally: `gpt1.recipes.sample.TextStream`), then
    `data: {"done": true, "text", "ids", "prompt_ids"}`."""
    from gpt1.recipes.sample import TextStream

    ids: list[int] = []
    text = TextStream(engine.tokenizer) if engine.tokenizer is not None else None
    try:
        async for token in tokens:
            ids.append(token)
            piece = text.push(token) if text is not None else None
            yield f"data: {json.dumps({'id': token, 'text': piece})}\n\n"
    except Exception as exc:  # headers are sent: report in the stream, one line
        yield f"data: {json.dumps({'error': ' '.join(str(exc).split())})}\n\n"
        return
    yield f"data: {json.dumps({'done': True, 'text': engine.decode(ids), 'ids': ids, 'prompt_ids': prompt})}\n\n"
