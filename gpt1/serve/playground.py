"""`GET /`: the playground, one static page (`static/playground.html`, plain JavaScript, no build
step) that calls this server's own API and loads nothing from anywhere else, so it works offline.

It streams `/v1/completions` with its log-probabilities (each token coloured by its probability,
the alternatives on hover), has a stop button (the request is aborted; the server stops the
generation when its client goes), reads the model's description from `/v1/models` and `/health`,
and, for a fine-tuned classifier, has a form of the task's fields that calls `/v1/predict`.

What the page cannot ask the API for is written into it here, once per app: the sampling
defaults (the completions body's own, so the page and the API cannot disagree), the server's
limits and the task's request fields with their roles.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from gpt1.serve.engine import Engine
from gpt1.serve.openai.schemas import MAX_LOGPROBS, CompletionRequest
from gpt1.serve.schemas import Limits
from gpt1.serve.security import page_policy

PATHS = {"/"}
SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed")


def page_config(engine: Engine, limits: Limits) -> dict[str, Any]:
    """What the page is told at load: sampling defaults, limits and the task's fields."""
    fields = {f.alias or name: f for name, f in CompletionRequest.model_fields.items()}
    return {
        "defaults": {name: fields[name].default for name in SAMPLING},  # by the names sent
        "max_new_tokens": limits.max_new_tokens,
        "max_logprobs": MAX_LOGPROBS,
        "fields": [{"name": name, "role": role} for name, role in engine.fields.items()],
    }


def playground_page(engine: Engine, limits: Limits) -> str:
    """The page's HTML with its configuration written in (as JSON a script cannot end early)."""
    template = resources.files("gpt1.serve").joinpath("static/playground.html").read_text("utf-8")
    config = json.dumps(page_config(engine, limits)).replace("<", "\\u003c")
    return template.replace("__CONFIG__", config)


def playground_router(engine: Engine, limits: Limits) -> APIRouter:
    """GET / serving the playground of `engine` (the page is built once)."""
    page = playground_page(engine, limits)
    policy = {"Content-Security-Policy": page_policy(page)}  # its own inline code only
    router = APIRouter()

    @router.get("/", include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(page, headers=policy)

    return router
