"""OpenAI-compatible endpoints: `/v1/completions`, `/v1/models`, the tokenizer endpoints.

- `POST /v1/completions`: OpenAI's completions request and response (`schemas`), its choices
  computed by `choices`, streamed by `stream`.
- `GET /v1/models`: the served model (its run's name, or `--served-model-name`), its window as
  `max_model_len`.
- `GET /tokenizer_info`, `POST /tokenize`, `POST /detokenize`: the shapes lm-evaluation-harness's
  remote tokenizer reads, so a harness run gets GPT-1's own ids with no tokenizer files.
- `POST /v1/chat/completions`: refused in one line (GPT-1 has no chat format).

Prompts are tokenized in a worker thread, never on the event loop. A prompt plus `max_tokens`
longer than the window is refused, never cut. Every refusal and failure is OpenAI's error object
(`errors`), naming the field as the client sent it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from gpt1.serve.engine import Engine
from gpt1.serve.events import STREAMED_OK
from gpt1.serve.openai import guided
from gpt1.serve.openai.choices import Choice, choice_json, compute, usage
from gpt1.serve.openai.errors import OpenAIRoute, Refused, openai_error
from gpt1.serve.openai.schemas import (
    OPENAI_ERROR_RESPONSES,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from gpt1.serve.openai.stream import stream
from gpt1.serve.openai.text import Continuation
from gpt1.serve.state import Serve, ServeState

PATHS = {
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/tokenizer_info",
    "/tokenize",
    "/detokenize",
}
NO_CHAT = (
    "GPT-1 has no chat format (it was trained on plain books text, with no roles or "
    "turns): send a text prompt to /v1/completions"
)


router = APIRouter(route_class=OpenAIRoute, responses=OPENAI_ERROR_RESPONSES)


# ------------------------------------------------------------------------------ checks
def check_model(serve: ServeState, name: str | None) -> None:
    if name is not None and name != serve.model_id:
        raise Refused(
            404,
            f"model {name!r} is not served here; this server serves {serve.model_id!r}",
            "model",
        )


def tokenizer_of(serve: ServeState) -> Any:
    if serve.engine.tokenizer is None:
        raise Refused(
            404, f"{serve.model_id} has no tokenizer files: no text to tokenize or decode"
        )
    return serve.engine.tokenizer


def encode_prompts(
    engine: Engine, prompts: list[str | list[int]], names: list[str]
) -> list[list[int]]:
    """Every prompt's ids (texts encoded, ids checked against the vocabulary); `names`: each
    prompt's field as the client sent it (`prompt`, `prompt.1`)."""
    out = []
    for name, p in zip(names, prompts):
        tokens = (
            engine.token_ids(p, None, name) if isinstance(p, str) else checked_ids(engine, p, name)
        )
        if not tokens:
            raise Refused(422, f"{name}: no tokens (GPT-1 has no start token to begin from)", name)
        out.append(tokens)
    return out


def checked_ids(engine: Engine, ids: list[int], name: str) -> list[int]:
    """`ids` when all are in the vocabulary, else a 422 naming the first outside it."""
    vocab = engine.lm.config.vocab_size
    for k, i in enumerate(ids):
        if not 0 <= i < vocab:
            where = f"{name}.{k}"
            raise Refused(
                422, f"{where}: token id {i} is outside the vocabulary (0..{vocab - 1})", where
            )
    return list(ids)


def check_lengths(serve: ServeState, body: CompletionRequest, prompts: list[list[int]]) -> None:
    """Each prompt and its `max_tokens` fit the window; the choices fit one request's limit
    (which the queue always holds: `--max-queue` is at least `--max-items`)."""
    window, most, names = serve.engine.window, serve.limits.max_items, body.prompt_fields()
    for name, p in zip(names, prompts):
        if len(p) + body.max_new_tokens > window:
            raise Refused(
                422,
                f"{name}: {len(p)} tokens + max_tokens {body.max_new_tokens} is more than the "
                f"model's {window}-token window (nothing is cut; send a shorter prompt)",
                name,
            )
    if len(prompts) * body.n > most:
        raise Refused(
            422,
            f"n: {len(prompts)} prompts x n={body.n} is {len(prompts) * body.n} choices, more "
            f"than this server's limit of {most} per request (--max-items)",
            "n",
        )


@router.post("/v1/completions", response_model=None, responses=STREAMED_OK)
async def completions(body: CompletionRequest, serve: Serve) -> Any:
    """OpenAI's completions API (see docs/commands/serve.md for every field)."""
    check_model(serve, body.model)
    tokenizer = tokenizer_of(serve)
    if body.guided_choice is not None:
        guided.check(body)
    prompts = await serve.off_loop(
        encode_prompts, serve.engine, body.prompts(), body.prompt_fields()
    )
    if body.guided_choice is not None:  # scored, not generated: max_tokens plays no part
        return await guided_response(serve, body, prompts)
    check_lengths(serve, body, prompts)
    choices = [
        Choice(i * body.n + j, p, Continuation(tokenizer, p, stops(body)))
        for i, p in enumerate(prompts)
        for j in range(body.n)
    ]
    head = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": serve.model_id,
    }
    if body.stream:
        return stream(serve, body, prompts, choices, head)
    await compute(serve, body, choices)
    payload = {
        **head,
        "choices": [choice_json(tokenizer, c, body) for c in choices],
        "usage": usage(prompts, choices),
    }
    return Response(await serve.off_loop(json.dumps, payload), media_type="application/json")


async def guided_response(
    serve: ServeState, body: CompletionRequest, prompts: list[list[int]]
) -> dict[str, Any]:
    choices = await guided.guided_choices(serve, body, prompts)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": serve.model_id,
        "choices": choices,
        "usage": usage(prompts, []),
    }


def stops(body: CompletionRequest) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


@router.post("/v1/chat/completions")
async def chat() -> JSONResponse:
    """Refused: GPT-1 has no chat format."""
    return openai_error(404, NO_CHAT)


@router.get("/v1/models")
async def models(serve: Serve) -> dict[str, Any]:
    """The served model, with its window as `max_model_len`."""
    return {
        "object": "list",
        "data": [
            {
                "id": serve.model_id,
                "object": "model",
                "created": serve.created,
                "owned_by": "gpt1",
                "max_model_len": serve.engine.window,
            }
        ],
    }


@router.get("/tokenizer_info", response_model=None)
async def tokenizer_info(serve: Serve) -> Any:
    """What a remote-tokenizer client needs (lm-evaluation-harness's `RemoteTokenizer`)."""
    tokenizer_of(serve)
    return tokenizer_description(serve.engine)


@router.post("/tokenize", response_model=None)
async def tokenize(body: TokenizeRequest, serve: Serve) -> Any:
    """GPT-1's ids for a text (no special tokens: GPT-1 adds none)."""
    check_model(serve, body.model)
    ids = await serve.off_loop(tokenizer_of(serve).encode, body.prompt)
    return {"tokens": list(ids), "count": len(ids), "max_model_len": serve.engine.window}


@router.post("/detokenize", response_model=None)
async def detokenize(body: DetokenizeRequest, serve: Serve) -> Any:
    """The text of token ids, as `Tokenizer.decode` writes it."""
    check_model(serve, body.model)
    tokenizer = tokenizer_of(serve)
    ids = checked_ids(serve.engine, body.tokens, "tokens")
    return {"prompt": await serve.off_loop(tokenizer.decode, ids)}


def tokenizer_description(engine: Engine) -> dict[str, Any]:
    """`eos_token` is null: GPT-1 has no end-of-text token, so nothing ends a generation but
    `max_tokens` or a stop string. `bos_token` is `<unk>` for a pretrained model: the token
    gpt1's harness adapter and its transformers export put before an empty context (the
    tokenizer maps the text `<unk>` to it), so the harness's prefix token is the native one."""
    fine_tuned = engine.task is not None
    return {
        "tokenizer_class": "gpt1 (ftfy, spaCy, lowercase, BPE with </w>)",
        "eos_token": None,
        "bos_token": None if fine_tuned else "<unk>",
        "pad_token": None,
        "unk_token": "<unk>",
        "model_max_length": engine.window,
        "vocab_size": engine.lm.config.vocab_size,
    }
