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

# No `from __future__ import annotations`: FastAPI reads the body types of the handlers below,
# which are local classes, from their evaluated annotations.
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute

from gpt1.errors import DataError, Gpt1Error
from gpt1.serve.batcher import Batcher, Job
from gpt1.serve.completion_schemas import (
    OPENAI_ERROR_RESPONSES,
    DetokenizeRequest,
    completion_model,
    tokenize_model,
)
from gpt1.serve.completion_text import Continuation, piece, text_offsets
from gpt1.serve.engine import Engine, GenerationRequest, SequenceLogprobs, SequenceScoring
from gpt1.serve.metrics import Metrics
from gpt1.serve.schemas import Limits

PATHS = {
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/tokenizer_info",
    "/tokenize",
    "/detokenize",
}
SCORE_KIND = "sequence_logprobs"  # the batcher job kind the app runs with engine.sequence_logprobs
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
    """A route whose refusals (bad fields, bad ids, `Refused`) answer in OpenAI's error shape;
    the messages are the rest of the API's (`describe_invalid` words a validation error)."""

    describe_invalid: Callable[[RequestValidationError], str] = str

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return _error(422, type(self).describe_invalid(exc))
            except Refused as exc:
                return _error(exc.status, str(exc))
            except Gpt1Error as exc:
                return _error(422, str(exc))

        return answer


@dataclass
class Choice:
    """One choice being computed: the prompt it continues and what it has so far."""

    index: int
    prompt: list[int]
    text: Continuation
    generated: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    numbers: SequenceLogprobs | None = None  # per-position logprobs of prompt + generated


class Completions:
    """The handlers' shared state: the engine, the batcher, and the app's `off_loop` (its one
    tokenizer thread: the tokenizer is not made for concurrent calls, so every endpoint
    tokenizes there)."""

    def __init__(
        self,
        engine: Engine,
        batcher: Batcher,
        metrics: Metrics,
        limits: Limits,
        off_loop: Callable[..., Awaitable[Any]],
    ):
        self.engine, self.batcher, self.metrics, self.limits = engine, batcher, metrics, limits
        self.off_loop = off_loop
        self.model_id = engine.folder.name
        self.created = int(engine.folder.stat().st_mtime)

    # ------------------------------------------------------------------- checks
    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_id:
            raise Refused(
                404, f"model {name!r} is not served here; this server serves {self.model_id!r}"
            )

    def tokenizer(self) -> Any:
        if self.engine.tokenizer is None:
            raise Refused(
                404, f"{self.model_id} has no tokenizer files: no text to tokenize or decode"
            )
        return self.engine.tokenizer

    def encode_prompts(self, prompts: list[str | list[int]]) -> list[list[int]]:
        """Every prompt's ids (texts encoded, ids checked against the vocabulary)."""
        out, vocab = [], self.engine.lm.config.vocab_size
        for n, p in enumerate(prompts):
            bad = [] if isinstance(p, str) else [i for i in p if not 0 <= i < vocab]
            if bad:
                raise DataError(
                    f"prompt {n}: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})"
                )
            tokens = self.engine.token_ids(p, None, "prompt") if isinstance(p, str) else list(p)
            if not tokens:
                raise DataError(f"prompt {n}: no tokens (GPT-1 has no start token to begin from)")
            out.append(tokens)
        return out

    def check_lengths(self, prompts: list[list[int]], max_tokens: int, n: int) -> None:
        window = self.engine.window
        for i, p in enumerate(prompts):
            if len(p) + max_tokens > window:
                raise Refused(
                    422,
                    f"prompt {i}: {len(p)} tokens + max_tokens {max_tokens} is more than the "
                    f"model's {window}-token window (nothing is cut; send a shorter prompt)",
                )
        if len(prompts) * n > self.limits.max_items:
            raise Refused(
                422, f"{len(prompts)} prompts x n={n}: more than {self.limits.max_items} choices"
            )

    # ------------------------------------------------------------------ compute
    async def scored(self, items: list[SequenceScoring]) -> list[SequenceLogprobs]:
        """One batcher job scoring `items` (joined with other requests' jobs)."""
        loop = asyncio.get_running_loop()
        tokens = sum(len(it.ids) for it in items)
        job = Job(SCORE_KIND, items, tokens, len(items), loop, future=loop.create_future())
        self.batcher.submit(job)
        self.metrics.queued.set(self.batcher.queued_items)
        return await job.future

    def start_generations(self, choices: list[Choice], body: Any) -> list[tuple[Job, Any]]:
        """Queue a generation per choice (all or none: a full queue cancels the ones queued)."""
        loop, started = asyncio.get_running_loop(), []
        try:
            for c in choices:
                seed = None if body.seed is None else body.seed + c.index % body.n
                request = GenerationRequest(
                    c.prompt, body.max_tokens, body.temperature, body.top_k, body.top_p, seed
                )
                events: asyncio.Queue = asyncio.Queue()
                job = Job("generate", request, len(c.prompt), 1, loop, emit=events.put_nowait)
                self.batcher.submit(job)
                started.append((job, events))
        except Exception:
            for job, _ in started:
                job.cancelled.set()
            raise
        return started

    async def run_generation(
        self, choice: Choice, job: Job, events: asyncio.Queue, on_text: Any = None
    ) -> None:
        """Collect a choice's tokens until its end or a stop string (`on_text(choice, text)`
        gets the text as it becomes certain)."""
        try:
            while not choice.text.stopped:
                item = await events.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                self.metrics.generated.inc()
                new = choice.text.push(item)
                if on_text is not None and new:
                    await on_text(choice, new)
        finally:
            job.cancelled.set()  # no-op when finished; frees the decoder after a stop
        if choice.text.stopped:
            choice.finish_reason = "stop"
        choice.generated = choice.text.kept_tokens()

    async def score_choices(self, choices: list[Choice], top: int) -> None:
        items = [SequenceScoring(c.prompt + c.generated, top) for c in choices]
        for c, numbers in zip(choices, await self.scored(items)):
            c.numbers = numbers

    async def score_prompts(self, choices: list[Choice], body: Any) -> None:
        """The scoring path: prompts (once each, however many choices share them) through the
        scorer; with max_tokens 1 the greedy next token comes from the same pass."""
        nxt = body.max_tokens == 1
        unique = {tuple(c.prompt): None for c in choices}
        items = [SequenceScoring(list(p), body.logprobs or 0, nxt) for p in unique]
        found = dict(zip(unique, await self.scored(items)))
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


def scoring_path(body: Any) -> bool:
    """An echo request with nothing to sample: the scorer alone answers it."""
    return bool(body.echo) and (
        body.max_tokens == 0 or (body.max_tokens == 1 and body.temperature == 0)
    )


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


def choice_json(tokenizer: Any, c: Choice, body: Any) -> dict[str, Any]:
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


def completions_router(
    engine: Engine,
    batcher: Batcher,
    metrics: Metrics,
    limits: Limits,
    off_loop: Callable[..., Awaitable[Any]],
    describe_invalid: Callable[[RequestValidationError], str] = str,
) -> APIRouter:
    """The routes above, for `create_app` to include (`off_loop`: runs a function in the app's
    tokenizer thread; `describe_invalid`: the app's one-line wording of a validation error)."""
    state = Completions(engine, batcher, metrics, limits, off_loop)
    route = type("Route", (OpenAIRoute,), {"describe_invalid": staticmethod(describe_invalid)})
    router = APIRouter(route_class=route, responses=OPENAI_ERROR_RESPONSES)
    CompletionRequest = completion_model(limits)
    TokenizeRequest = tokenize_model(limits)

    @router.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> Any:  # type: ignore[valid-type]
        """OpenAI's completions API (see docs/commands/serve.md for every field)."""
        state.check_model(body.model)
        tokenizer = state.tokenizer()
        if body.stream and body.logprobs is not None:
            raise Refused(422, "logprobs: not available with stream; ask without stream")
        prompts = await state.off_loop(state.encode_prompts, body.prompts())
        state.check_lengths(prompts, body.max_tokens, body.n)
        choices = [
            Choice(i * body.n + j, p, Continuation(tokenizer, p, stops(body)))
            for i, p in enumerate(prompts)
            for j in range(body.n)
        ]
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": state.model_id,
        }
        if body.stream:
            return await stream(state, body, prompts, choices, head)
        await compute(state, body, choices)
        payload = {
            **head,
            "choices": [choice_json(tokenizer, c, body) for c in choices],
            "usage": usage(prompts, choices),
        }
        return Response(await state.off_loop(json.dumps, payload), media_type="application/json")

    @router.post("/v1/chat/completions")
    async def chat() -> JSONResponse:
        """Refused: GPT-1 has no chat format."""
        return _error(404, NO_CHAT)

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        """The served model, with its window as `max_model_len`."""
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_id,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "gpt1",
                    "max_model_len": engine.window,
                }
            ],
        }

    @router.get("/tokenizer_info", response_model=None)
    async def tokenizer_info() -> Any:
        """What a remote-tokenizer client needs (lm-evaluation-harness's `RemoteTokenizer`)."""
        state.tokenizer()
        return tokenizer_description(engine)

    @router.post("/tokenize", response_model=None)
    async def tokenize(body: TokenizeRequest) -> Any:  # type: ignore[valid-type]
        """GPT-1's ids for a text (no special tokens: GPT-1 adds none)."""
        state.check_model(body.model)
        tok = state.tokenizer()
        ids = await state.off_loop(tok.encode, body.prompt)
        return {"tokens": list(ids), "count": len(ids), "max_model_len": engine.window}

    @router.post("/detokenize", response_model=None)
    async def detokenize(body: DetokenizeRequest) -> Any:
        """The text of token ids, as `Tokenizer.decode` writes it."""
        state.check_model(body.model)
        tok = state.tokenizer()
        ids = engine.token_ids(None, body.tokens, "tokens")
        return {"prompt": await state.off_loop(tok.decode, ids)}

    return router


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


def stops(body: Any) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


async def compute(
    state: Completions, body: Any, choices: list[Choice], on_text: Any = None
) -> None:
    """Fill in every choice: by the scorer alone, or by generation (then the scorer when
    numbers are asked for)."""
    if scoring_path(body):
        if body.max_tokens == 1 or body.logprobs is not None:
            await state.score_prompts(choices, body)
        return
    started = state.start_generations(choices, body)
    await asyncio.gather(
        *(state.run_generation(c, job, q, on_text) for c, (job, q) in zip(choices, started))
    )
    if body.logprobs is not None:
        await state.score_choices(choices, body.logprobs)


async def stream(
    state: Completions, body: Any, prompts: list[list[int]], choices: list[Choice], head: dict
) -> StreamingResponse:
    """Server-sent chunks in OpenAI's shape: text as it comes, per choice; a last chunk per
    choice with its finish_reason; the usage when `stream_options.include_usage`; `[DONE]`."""
    out: asyncio.Queue = asyncio.Queue()

    def chunk(choice_list: list[dict], **extra: Any) -> str:
        return f"data: {json.dumps({**head, 'choices': choice_list, **extra})}\n\n"

    def text_chunk(c: Choice, text: str, finish: str | None = None) -> str:
        return chunk([{"index": c.index, "text": text, "logprobs": None, "finish_reason": finish}])

    async def on_text(c: Choice, text: str) -> None:
        out.put_nowait(text_chunk(c, text))

    if body.echo:
        for c in choices:
            out.put_nowait(text_chunk(c, c.text.prompt_text))
    scoring = scoring_path(body)
    started = None if scoring else state.start_generations(choices, body)  # 503 here if full

    async def work() -> None:
        try:
            if scoring:
                await compute(state, body, choices)
                for c in choices:
                    out.put_nowait(text_chunk(c, c.text.finish()))
            else:
                await asyncio.gather(
                    *(
                        state.run_generation(c, job, q, on_text)
                        for c, (job, q) in zip(choices, started)
                    )
                )
            for c in choices:
                out.put_nowait(text_chunk(c, c.text.finish(), c.finish_reason))
            if body.stream_options is not None and body.stream_options.include_usage:
                out.put_nowait(chunk([], usage=usage(prompts, choices)))
        except Exception as exc:  # headers are sent: report in the stream, one line
            message = " ".join(str(exc).split())
            out.put_nowait(f"data: {json.dumps({'error': {'message': message}})}\n\n")
        out.put_nowait(None)

    async def events() -> AsyncIterator[str]:
        task = asyncio.create_task(work())
        try:
            while (item := await out.get()) is not None:
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
