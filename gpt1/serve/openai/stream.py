"""A streamed `/v1/completions` answer (`"stream": true`): server-sent chunks in OpenAI's shape.

Joined, a stream's chunks give the unstreamed answer: per choice the same text, finish_reason
and (asked for with `logprobs`) the same logprobs object; the usage chunk
(`stream_options.include_usage`) the same usage. How the text comes:
- a generation without `logprobs`: the echoed prompt first (`echo`), then the text as it becomes
  certain (never text a stop string could still cut), then a last chunk with the finish_reason;
- with `logprobs`, the same, and a choice's whole logprobs object in its last chunk (the
  earlier ones say null: the numbers come from scoring the whole choice after its generation);
- a scoring request (`echo` with `max_tokens` 0, or 1 at temperature 0): the echoed prompt, then
  the choice's text with its finish_reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from gpt1.serve.events import Data, EventStream
from gpt1.serve.openai.choices import (
    Choice,
    Started,
    choice_json,
    choice_logprobs,
    compute,
    run_generations,
    score_choices,
    scoring_path,
    start_generations,
    usage,
)
from gpt1.serve.openai.errors import answer_failure
from gpt1.serve.openai.schemas import CompletionRequest
from gpt1.serve.state import ServeState


class Chunks:
    """The chunks of one streamed completion, queued for its response (None ends them), in
    OpenAI's shape: `head` and a list of choices."""

    def __init__(self, head: dict[str, Any]):
        self.head = head
        self.queue: asyncio.Queue[Data | None] = asyncio.Queue()

    def put(self, choices: list[dict], **extra: Any) -> None:
        self.queue.put_nowait({**self.head, "choices": choices, **extra})

    def text(
        self, c: Choice, text: str, finish: str | None = None, logprobs: dict | None = None
    ) -> None:
        self.put([{"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": finish}])

    async def on_text(self, c: Choice, text: str) -> None:
        self.text(c, text)

    def error(self, exc: Exception, path: str) -> None:
        """Headers are sent: the error object goes in the stream, as its last chunk."""
        self.queue.put_nowait(answer_failure(exc, path).body.decode())


def stream(
    serve: ServeState,
    body: CompletionRequest,
    prompts: list[list[int]],
    choices: list[Choice],
    head: dict[str, Any],
) -> EventStream:
    """The chunks (the module docstring's) as server-sent events, then `[DONE]`. The
    generations are queued before the response starts, so a full queue is still a 503."""
    chunks = Chunks(head)
    started = None if scoring_path(body) else start_generations(serve, choices, body)
    if body.echo and started is not None:
        for c in choices:
            chunks.text(c, c.text.prompt_text)

    task: asyncio.Task | None = None

    async def events() -> AsyncGenerator[Data, None]:
        nonlocal task
        task = asyncio.create_task(stream_work(serve, body, prompts, choices, started, chunks))
        while (item := await chunks.queue.get()) is not None:
            yield item

    def stop() -> None:
        """The response ended (the client may have left): stop the work and the generations."""
        if task is not None and not task.done():
            task.cancel()
        for job, _ in started or []:
            job.cancelled.set()

    return EventStream(events(), done=True, on_close=stop)


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
        if started is None:  # scored, not generated: each choice in one chunk
            await compute(serve, body, choices)
            for c in choices:
                chunks.put([choice_json(serve.engine.tokenizer, c, body)])
        else:
            await run_generations(choices, started, chunks.on_text)
            if body.logprobs is not None:
                await score_choices(serve, choices, body.logprobs)
            for c in choices:
                numbers = None
                if body.logprobs is not None:
                    numbers = choice_logprobs(
                        serve.engine.tokenizer, c, bool(body.echo), body.logprobs
                    )
                chunks.text(c, c.text.finish(), c.finish_reason, numbers)
        if body.stream_options is not None and body.stream_options.include_usage:
            chunks.put([], usage=usage(prompts, choices))
    except Exception as exc:
        chunks.error(exc, "/v1/completions")
    chunks.queue.put_nowait(None)
