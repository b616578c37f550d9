"""The HTTP API (FastAPI): /v1/predict, /v1/generate, /v1/score, /health, /metrics, /docs
(`gpt1.serve.routes`), and the OpenAI-compatible endpoints of `gpt1.serve.openai`
(/v1/completions, /v1/models, ...).

Every error is JSON `{"error": "<one line>"}` with a 4xx status for a bad request (422: invalid
body, 413: body too large, 408: body not sent in time, 404: unknown path or an endpoint this
model does not serve), 503 with `Retry-After` when the queue is full, 500 (logged with its
traceback) for a bug; on the OpenAI-compatible paths each is OpenAI's error object. The
handlers share one `ServeState` per app (`gpt1.serve.state`); the `Guard` middleware
(`gpt1.serve.guard`) wraps the app, with the server's gate (`gpt1.serve.security`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gpt1.errors import Gpt1Error
from gpt1.serve import playground, routes
from gpt1.serve.batcher import Batcher, QueueFull
from gpt1.serve.connections import quiet_accept_errors
from gpt1.serve.engine import Engine
from gpt1.serve.guard import Guard
from gpt1.serve.metrics import Metrics
from gpt1.serve.openai import routes as openai_routes
from gpt1.serve.openai.errors import refusal
from gpt1.serve.options import ServeOptions
from gpt1.serve.responses import RETRY_AFTER_S, error, parse_failure, validation_message
from gpt1.serve.state import ServeState, run_batch

log = logging.getLogger("gpt1.serve")
ENDPOINTS = routes.PATHS | openai_routes.PATHS | playground.PATHS  # the metrics' endpoint labels


def create_app(engine: Engine, options: ServeOptions | None = None) -> Guard:
    """The ASGI app serving `engine` as `options` say (default: as `gpt1 serve` does), wrapped
    in the `Guard` middleware."""
    options = options or ServeOptions()
    limits = options.limits
    metrics = Metrics()
    batcher = Batcher(
        partial(run_batch, engine, options.batch_items),
        options.batch_tokens,
        options.batch_items,
        options.batch_wait_ms / 1000,
        options.max_queue,
        options.generations_for(getattr(engine, "precision", "fp32")),
        on_batch=metrics.observe_batch,
        generations=engine,
    )
    app = FastAPI(
        title="gpt1",
        version="1",
        lifespan=lifespan,
        description="GPT-1 inference: predict with a fine-tuned run, generate and "
        'score with a language model. Errors are {"error": "..."}.',
        docs_url=None,  # served by routes.info_router without a CDN
        redoc_url=None,
    )
    app.state.serve = ServeState(engine, batcher, metrics, limits, options.served_model_name)
    for kind, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(kind, handler)
    app.include_router(openai_routes.router)
    app.include_router(routes.info_router)
    if engine.task is not None:  # a language model has no task to predict
        app.include_router(routes.predict_router(engine.fields))
    app.include_router(routes.lm_router)
    if options.with_playground:
        app.include_router(playground.playground_router(engine, limits))
    return Guard(
        app,
        metrics,
        limits,
        ENDPOINTS,
        openai_routes.PATHS,
        options.security,
        options.request_timeout,
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    serve: ServeState = app.state.serve
    quiet_accept_errors(asyncio.get_running_loop())
    serve.batcher.start()
    log.info("gpt1 serve: %s ready", serve.engine.folder)
    yield
    serve.batcher.stop()  # uvicorn has already let the requests in flight finish
    serve.tokenizer_thread.shutdown(wait=False)


# ---------------------------------------------------------------------- error handlers
async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error(422, validation_message(exc))


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    path = request.url.path
    if exc.status_code == 400 and exc.__cause__ is not None:  # JSON the parser gave up on
        return answer(path, 422, f"body is not valid JSON: {parse_failure(exc.__cause__)}")
    if exc.status_code == 404 and path == "/v1/predict":
        return error(
            404,
            "this model is a pretrained language model: /v1/predict needs a "
            "fine-tuned run (use /v1/generate or /v1/score)",
        )
    if exc.status_code == 404:
        return error(404, f"no such endpoint: {path} (see /docs)")
    if exc.status_code == 405:
        return answer(path, 405, f"{request.method} is not allowed on {path}", exc.headers)
    return answer(path, exc.status_code, exc.detail, exc.headers)


def answer(path: str, status: int, message: str, headers: Any = None) -> JSONResponse:
    """A refusal in the protocol of `path` (OpenAI's error object on its routes)."""
    return refusal(path in openai_routes.PATHS, status, message, headers=headers)


async def user_error(request: Request, exc: Gpt1Error) -> JSONResponse:
    return error(422, str(exc))


async def busy(request: Request, exc: QueueFull) -> JSONResponse:
    return error(503, f"server busy: {exc}; retry later", {"Retry-After": str(RETRY_AFTER_S)})


async def bug(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error on %s", request.url.path)
    return error(500, f"internal error: {type(exc).__name__}: {exc}")


ERROR_HANDLERS: dict[type[Exception], Any] = {
    RequestValidationError: invalid,
    HTTPException: http_error,
    Gpt1Error: user_error,
    QueueFull: busy,
    Exception: bug,
}
