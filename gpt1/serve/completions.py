"""OpenAI-compatible endpoints: `/v1/completions`, `/v1/models`, the tokenizer endpoints.

- `POST /v1/completions`: OpenAI's completions request and response (`completion_schemas`).
  A scoring request (`echo` with `max_tokens` 0, or 1 at temperature 0: what
  lm-evaluation-harness's `local-completions` sends) runs as a "sequence_logprobs" job: the
  batcher joins it with the other requests' jobs into one call of the zero-shot scorer (the
  path `/v1/score` takes), whose top alternative after the prompt is the greedy next token. Any
  other request runs its choices as generations (the decoder `/v1/generate` uses), and, when
  `logprobs` or `echo` asks for numbers, scores prompt + generated tokens in one more scorer job.
- `GET /v1/models`: the served checkpoint, its window as `max_model_len`.
- `GET /tokenizer_info`, `POST /tokenize`, `POST /detokenize`: the shapes lm-evaluation-harness's
  remote tokenizer reads, so a harness run gets GPT-1's own ids with no tokenizer files.
- `POST /v1/chat/completions`: refused in one line (GPT-1 has no chat format).

Prompts are tokenized in a worker thread, never on the event loop. A prompt plus `max_tokens`
longer than the window is refused, never cut.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute

from gpt1.errors import DataError, Gpt1Error
from gpt1.serve import guided
from gpt1.serve.batcher import Job
from gpt1.serve.completion_schemas import (
    OPENAI_ERROR_RESPONSES,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from gpt1.serve.completion_text import Continuation, piece, text_offsets
from gpt1.serve.engine import Engine, SequenceLogprobs, SequenceScoring
from gpt1.serve.responses import validation_message
from gpt1.serve.state import SCORE_KIND, Serve, ServeState

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


class Refused(Exception):
    """A request answered with `status` and a one-line message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    """OpenAI's error shape, which its clients read (the SDK puts `message` in its exception)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"message": " ".join(str(message).split()), "type": kind, "code": status}
    return JSONResponse({"error": body}, status)


class OpenAIRoute(APIRoute):
    """A route whose refusals (bad fields, bad ids, `Refused`) answer in OpenAI's error shape,
    in the words of the rest of the API."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return _error(422, validation_message(exc))
            except Refused as exc:
                return _error(exc.status, str(exc))
            except Gpt1Error as exc:
                return _error(422, str(exc))

        return answer


router = APIRouter(route_class=OpenAIRoute, responses=OPENAI_ERROR_RESPONSES)


# ------------------------------------------------------------------------------ checks
def check_model(serve: ServeState, name: str | None) -> None:
    if name is not None and name != serve.model_id:
        raise Refused(
            404, f"model {name!r} is not served here; this server serves {serve.model_id!r}"
        )


def tokenizer_of(serve: ServeState) -> Any:
    if serve.engine.tokenizer is None:
        raise Refused(
            404, f"{serve.model_id} has no tokenizer files: no text to tokenize or decode"
        )
    return serve.engine.tokenizer


def encode_prompts(engine: Engine, prompts: list[str | list[int]]) -> list[list[int]]:
    """Every prompt's ids (texts encoded, ids checked against the vocabulary)."""
    out, vocab = [], engine.lm.config.vocab_size
    for n, p in enumerate(prompts):
        bad = [] if isinstance(p, str) else [i for i in p if not 0 <= i < vocab]
        if bad:
            raise DataError(
                f"prompt {n}: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})"
            )
        tokens = engine.token_ids(p, None, "prompt") if isinstance(p, str) else list(p)
        if not tokens:
            raise DataError(f"prompt {n}: no tokens (GPT-1 has no start token to begin from)")
        out.append(tokens)
    return out


def check_lengths(serve: ServeState, prompts: list[list[int]], max_tokens: int, n: int) -> None:
    window, most = serve.engine.window, serve.limits.max_items
    for i, p in enumerate(prompts):
        if len(p) + max_tokens > window:
            raise Refused(
                422,
                f"prompt {i}: {len(p)} tokens + max_tokens {max_tokens} is more than the "
                f"model's {window}-token window (nothing is cut; send a shorter prompt)",
            )
    if len(prompts) * n > most:
        raise Refused(422, f"{len(prompts)} prompts x n={n}: more than {most} choices")


# ----------------------------------------------------------------------------- compute
@dataclass
class Choice:
    """One choice being computed: the prompt it continues and what it has so far."""

    index: int
    prompt: list[int]
    text: Continuation
    generated: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    numbers: SequenceLogprobs | None = None  # per-position logprobs of prompt + generated


Started = list[tuple[Job, AsyncGenerator[int, None]]]  # each choice's generation, its tokens
OnText = Callable[[Choice, str], Awaitable[None]]


def scoring_path(body: CompletionRequest) -> bool:
    """An echo request with nothing to sample: the scorer alone answers it."""
    return bool(body.echo) and (
        body.max_tokens == 0 or (body.max_tokens == 1 and body.temperature == 0)
    )


async def compute(serve: ServeState, body: CompletionRequest, choices: list[Choice]) -> None:
    """Fill in every choice: by the scorer alone, or by generation (then the scorer when
    numbers are asked for)."""
    if scoring_path(body):
        if body.max_tokens == 1 or body.logprobs is not None:
            await score_prompts(serve, choices, body)
        return
    await run_generations(choices, start_generations(serve, choices, body))
    if body.logprobs is not None:
        await score_choices(serve, choices, body.logprobs)


def start_generations(serve: ServeState, choices: list[Choice], body: CompletionRequest) -> Started:
    """Queue a generation per choice (all or none: a full queue cancels the ones queued)."""
    started: Started = []
    try:
        for c in choices:
            seed = None if body.seed is None else body.seed + c.index % body.n
            request = serve.engine.generation(
                c.prompt, body.max_tokens, body.temperature, body.top_k, body.top_p, seed
            )
            started.append(serve.generate(request))
    except Exception:
        for job, _ in started:
            job.cancelled.set()
        raise
    return started


async def run_generations(
    choices: list[Choice], started: Started, on_text: OnText | None = None
) -> None:
    await asyncio.gather(
        *(run_generation(c, tokens, on_text) for c, (_, tokens) in zip(choices, started))
    )


async def run_generation(
    choice: Choice, tokens: AsyncGenerator[int, None], on_text: OnText | None = None
) -> None:
    """Collect a choice's tokens until its end or a stop string (`on_text(choice, text)` gets
    the text as it becomes certain); leaving the tokens stops the generation."""
    async with aclosing(tokens):
        async for token in tokens:
            new = choice.text.push(token)
            if on_text is not None and new:
                await on_text(choice, new)
            if choice.text.stopped:
                break
    if choice.text.stopped:
        choice.finish_reason = "stop"
    choice.generated = choice.text.kept_tokens()


async def scored(serve: ServeState, items: list[SequenceScoring]) -> list[SequenceLogprobs]:
    """One batcher job scoring `items` (joined with other requests' jobs)."""
    return await serve.run(SCORE_KIND, items, sum(len(it.ids) for it in items))


async def score_choices(serve: ServeState, choices: list[Choice], top: int) -> None:
    items = [SequenceScoring(c.prompt + c.generated, top) for c in choices]
    for c, numbers in zip(choices, await scored(serve, items)):
        c.numbers = numbers


async def score_prompts(serve: ServeState, choices: list[Choice], body: CompletionRequest) -> None:
    """The scoring path: prompts (once each, however many choices share them) through the
    scorer; with max_tokens 1 the greedy next token comes from the same pass."""
    nxt = body.max_tokens == 1
    unique = {tuple(c.prompt): None for c in choices}
    items = [SequenceScoring(list(p), body.logprobs or 0, nxt) for p in unique]
    found = dict(zip(unique, await scored(serve, items)))
    for c in choices:
        numbers = found[tuple(c.prompt)]
        c.numbers = numbers
        if nxt:
            token, logprob = numbers.next[0]
            c.text.push(token)
            c.generated = c.text.kept_tokens()
            c.finish_reason = "stop" if c.text.stopped else "length"
            if c.generated:
                c.numbers = SequenceLogprobs(
                    numbers.logprobs + [logprob],
                    numbers.top + [numbers.next[: body.logprobs or 0]],
                    None,
                )


# ---------------------------------------------------------------------------- answers
def choice_logprobs(tokenizer: Any, c: Choice, echo: bool, k: int) -> dict[str, Any]:
    """OpenAI's logprobs object for a choice: tokens, token_logprobs, top_logprobs, text_offset
    (where each token's text starts in the choice's text)."""
    ids = c.prompt + c.generated
    logprobs: list[float | None] = [None] + list(c.numbers.logprobs[: len(ids) - 1])
    tops: list[Any] = [None] + [
        {piece(tokenizer, t): lp for t, lp in alts} for alts in c.numbers.top[: len(ids) - 1]
    ]
    start = 0 if echo else len(c.prompt)
    first = 0 if echo else len(c.text.prompt_raw) - len(c.text.prompt_text)
    return {
        "tokens": [piece(tokenizer, t) for t in ids[start:]],
        "token_logprobs": logprobs[start:],
        "top_logprobs": tops[start:],
        "text_offset": text_offsets(tokenizer, ids[start:], first),
    }


def choice_json(tokenizer: Any, c: Choice, body: CompletionRequest) -> dict[str, Any]:
    text = c.text.text
    return {
        "index": c.index,
        "text": c.text.prompt_text + text if body.echo else text,
        "logprobs": None
        if body.logprobs is None
        else choice_logprobs(tokenizer, c, bool(body.echo), body.logprobs),
        "finish_reason": c.finish_reason,
    }


def usage(prompts: list[list[int]], choices: list[Choice]) -> dict[str, int]:
    prompt = sum(len(p) for p in prompts)
    completion = sum(len(c.generated) for c in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, serve: Serve) -> Any:
    """OpenAI's completions API (see docs/commands/serve.md for every field)."""
    check_model(serve, body.model)
    tokenizer = tokenizer_of(serve)
    if body.guided_choice is not None:
        guided.check(body)
    prompts = await serve.off_loop(encode_prompts, serve.engine, body.prompts())
    if body.guided_choice is not None:  # scored, not generated: max_tokens plays no part
        return await guided_response(serve, body, prompts)
    check_lengths(serve, prompts, body.max_tokens, body.n)
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
    return _error(404, NO_CHAT)


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
    ids = serve.engine.token_ids(None, body.tokens, "tokens")
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


# --------------------------------------------------------------------------- streaming
class Chunks:
    """The server-sent chunks of one streamed completion, queued for its response (None ends
    them), in OpenAI's shape: `head` and a list of choices."""

    def __init__(self, head: dict[str, Any]):
        self.head = head
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()

    def put(self, choices: list[dict], **extra: Any) -> None:
        self.queue.put_nowait(f"data: {json.dumps({**self.head, 'choices': choices, **extra})}\n\n")

    def text(
        self, c: Choice, text: str, finish: str | None = None, logprobs: dict | None = None
    ) -> None:
        self.put([{"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": finish}])

    async def on_text(self, c: Choice, text: str) -> None:
        self.text(c, text)

    def error(self, exc: Exception) -> None:  # headers are sent: report in the stream, one line
        message = " ".join(str(exc).split())
        self.queue.put_nowait(f"data: {json.dumps({'error': {'message': message}})}\n\n")


def stream(
    serve: ServeState,
    body: CompletionRequest,
    prompts: list[list[int]],
    choices: list[Choice],
    head: dict[str, Any],
) -> StreamingResponse:
    """Server-sent chunks: text as it comes, per choice; a last chunk per choice with its
    finish_reason; the usage when `stream_options.include_usage`; `[DONE]`."""
    chunks = Chunks(head)
    if body.echo:
        for c in choices:
            chunks.text(c, c.text.prompt_text)
    started = None if scoring_path(body) else start_generations(serve, choices, body)  # 503 here

    async def events() -> AsyncIterator[str]:
        task = asyncio.create_task(stream_work(serve, body, prompts, choices, started, chunks))
        try:
            while (item := await chunks.queue.get()) is not None:
                yield item
            yield "data: [DONE]\n\n"
        finally:
            if not task.done():  # the client left: stop the generations
                task.cancel()
            for job, _ in started or []:
                job.cancelled.set()

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def stream_work(
    serve: ServeState,
    body: CompletionRequest,
    prompts: list[list[int]],
    choices: list[Choice],
    started: Started | None,
    chunks: Chunks,
) -> None:
    """Compute a streamed completion's choices into `chunks` (`started`: their generations,
    None on the scoring path)."""
    try:
        if started is None:
            await compute(serve, body, choices)
            for c in choices:
                chunks.text(c, c.text.finish())
        else:
            await run_generations(choices, started, chunks.on_text)
            if body.logprobs is not None:
                await score_choices(serve, choices, body.logprobs)
        for c in choices:
            chunks.text(c, c.text.finish(), c.finish_reason, last_logprobs(serve, body, c))
        if body.stream_options is not None and body.stream_options.include_usage:
            chunks.put([], usage=usage(prompts, choices))
    except Exception as exc:
        chunks.error(exc)
    chunks.queue.put_nowait(None)


def last_logprobs(serve: ServeState, body: CompletionRequest, c: Choice) -> dict | None:
    """A streamed choice's logprobs, all in its last chunk (the earlier chunks say null): the
    numbers a plain request gets, from the same scoring pass after the generation, so the
    chunks' logprobs joined equal the plain response's."""
    if body.logprobs is None:
        return None
    return choice_logprobs(serve.engine.tokenizer, c, bool(body.echo), body.logprobs)
