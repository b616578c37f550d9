"""The native endpoints, as routers the app includes:

- `info_router`: GET /health (liveness and what is served), /metrics (Prometheus), /docs;
- `predict_router(fields)`: POST /v1/predict, for a fine-tuned model only;
- `lm_router`: POST /v1/score and /v1/generate, for any model.

A handler takes the app's shared state as its `Serve` parameter (`gpt1.serve.state`). A
client that leaves is the middleware's (`gpt1.serve.guard`): its work is cancelled, whatever
the route, and a generation stops before the next decoding step.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import torch
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from gpt1.serve.docs_page import docs_page
from gpt1.serve.engine import Engine
from gpt1.serve.events import STREAMED_OK, Data, EventStream
from gpt1.serve.responses import error
from gpt1.serve.schemas import (
    ERROR_RESPONSES,
    GATE_RESPONSES,
    GenerateRequest,
    PredictBody,
    ScoreItem,
    ScoreRequest,
    predict_model,
)
from gpt1.serve.security import page_policy
from gpt1.serve.state import Serve

info_router = APIRouter(responses=GATE_RESPONSES)
lm_router = APIRouter(responses=ERROR_RESPONSES)
PATHS = {"/v1/predict", "/v1/generate", "/v1/score", "/health", "/metrics"}


@info_router.get("/health")
async def health(serve: Serve) -> dict[str, Any]:
    """Liveness, what is being served, and the CPU threads torch runs with now (`--threads
    auto` follows the machine's load between scoring batches)."""
    return {
        "status": "ok",
        **serve.engine.describe(),
        "served_model_name": serve.model_id,
        "threads": torch.get_num_threads(),
        "queued_items": serve.batcher.queued_items,
        "active_generations": serve.batcher.active_generations,
    }


@info_router.get("/metrics", response_class=PlainTextResponse)
async def prometheus(serve: Serve) -> Response:
    """Prometheus text format."""
    metrics = serve.metrics
    metrics.queued.set(serve.batcher.queued_items)
    metrics.active_generations.set(serve.batcher.active_generations)
    return Response(metrics.render(), media_type=metrics.content_type)


# The pages' icon (browsers ask for /favicon.ico whatever a page says): a small "1" in a square.
ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect width="16" height="16" rx="3" fill="#2b5d8a"/>'
    '<text x="8" y="12.5" font-size="11" font-family="sans-serif" text-anchor="middle" '
    'fill="#fff">1</text></svg>'
)


@info_router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> Response:
    return Response(ICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


@info_router.get("/docs", include_in_schema=False)
async def docs(request: Request) -> HTMLResponse:
    page = docs_page(request.app.title)
    return HTMLResponse(page, headers={"Content-Security-Policy": page_policy(page)})


def predict_router(fields: dict[str, str]) -> APIRouter:
    """POST /v1/predict for a task whose request fields map to roles `fields`. Its body names
    the task's own fields, so its class is built per model (`schemas.predict_model`)."""

    async def predict_endpoint(body: PredictBody, serve: Serve) -> dict[str, Any]:
        return await predict(body, serve)

    # FastAPI validates the body as the class this annotation names: the task's own.
    predict_endpoint.__annotations__["body"] = predict_model(fields)
    router = APIRouter(responses=ERROR_RESPONSES)
    router.add_api_route(
        "/v1/predict",
        predict_endpoint,
        methods=["POST"],
        name="predict",
        description=predict.__doc__,
    )
    return router


async def predict(body: PredictBody, serve: Serve) -> dict[str, Any]:
    """Label (or score) and probabilities per item, exactly as `gpt1 predict` computes them."""
    engine = serve.engine
    items = [item.model_dump(by_alias=True) for item in body.inputs]
    encoded = await serve.off_loop(lambda: engine.encode(engine.examples(items, body.sent_one)))
    tokens = sum(len(seq) for item in encoded for seq in item)
    predictions = await serve.run("predict", encoded, tokens)
    labels = engine.task.labels if not engine.task.is_choice else None
    return {"predictions": [p.as_dict(labels) for p in predictions]}


@lm_router.post("/v1/score", response_model=dict[str, Any])
async def score(body: ScoreRequest, serve: Serve) -> Any:
    """Log-probability of each continuation's tokens given its context (zero-shot scorer)."""
    engine = serve.engine
    pairs = await serve.off_loop(
        lambda: [_score_pair(engine, it, f"items.{n}.") for n, it in enumerate(body.items)]
    )
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
    return {"results": await serve.run("score", pairs, tokens)}


def _score_pair(engine: Engine, item: ScoreItem, at: str) -> tuple[list[int], list[int]]:
    """The item's ids; a refusal names its field as sent (`at`: `items.3.`)."""
    return (
        engine.token_ids(item.context, item.context_ids, f"{at}context"),
        engine.token_ids(item.continuation, item.continuation_ids, f"{at}continuation"),
    )


@lm_router.post("/v1/generate", response_model=None, responses=STREAMED_OK)
async def generate(body: GenerateRequest, serve: Serve) -> Any:
    """Continue a prompt (gpt1 sample's options); `"stream": true` sends server-sent events."""
    engine = serve.engine
    prompt = await serve.off_loop(engine.token_ids, body.prompt, body.prompt_ids, "prompt")
    if not prompt:
        return error(422, "prompt: no tokens after tokenization")
    if len(prompt) > engine.window:  # the window it was trained on: one window per checkpoint
        return error(
            422,
            f"prompt: {len(prompt)} tokens, more than the model's {engine.window}-token window",
        )
    job, tokens = serve.generate(engine.generation(prompt, body.sampling()))
    if body.stream:
        # The generation stops as soon as the response ends, however it ends.
        return EventStream(_events(engine, prompt, tokens), on_close=job.cancelled.set)
    ids = [t async for t in tokens]
    return {"text": engine.decode(ids), "ids": ids, "prompt_ids": prompt}


async def _events(
    engine: Engine, prompt: list[int], tokens: AsyncIterator[int]
) -> AsyncGenerator[Data, None]:
    """The stream's events: one `{"id", "text"}` per token (`text` is what it adds to the
    decoded continuation, decoded incrementally: `gpt1.inference.generate.TextStream`), then
    `{"done": true, "text", "ids", "prompt_ids"}`."""
    from gpt1.inference.generate import TextStream

    ids: list[int] = []
    text = TextStream(engine.tokenizer) if engine.tokenizer is not None else None
    try:
        async for token in tokens:
            ids.append(token)
            piece = text.push(token) if text is not None else None
            yield {"id": token, "text": piece}
    except Exception as exc:  # headers are sent: report in the stream, one line
        yield {"error": " ".join(str(exc).split())}
        return
    yield {"done": True, "text": engine.decode(ids), "ids": ids, "prompt_ids": prompt}
