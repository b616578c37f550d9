"""The choices of one `/v1/completions` request: computed, then written in OpenAI's shape.

A scoring request (`echo` with `max_tokens` 0, or 1 at temperature 0: what
lm-evaluation-harness's `local-completions` sends) runs as a "sequence_logprobs" job: the batcher
joins it with the other requests' jobs into one call of the zero-shot scorer (the path `/v1/score`
takes), whose top alternative after the prompt is the greedy next token. Any other request runs
its choices as generations (the decoder `/v1/generate` uses), and, when `logprobs` asks for
numbers, scores prompt + generated tokens in one more scorer job.

Usage and logprobs describe the text returned: a token is counted (and listed) when any of its
text is in the answer, so a stop string that cuts a token keeps that token
(`Continuation.kept_tokens`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from gpt1.serve.batcher import Job
from gpt1.serve.engine import SequenceLogprobs, SequenceScoring
from gpt1.serve.openai.schemas import CompletionRequest
from gpt1.serve.openai.text import Continuation, piece, text_offsets
from gpt1.serve.state import SCORE_KIND, ServeState


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
        body.max_new_tokens == 0 or (body.max_new_tokens == 1 and body.temperature == 0)
    )


async def compute(
    serve: ServeState,
    body: CompletionRequest,
    choices: list[Choice],
    started: Started | None = None,
) -> None:
    """Fill in every choice: by the scorer alone, or by generation (`started`: the choices'
    generations when queued already), then the scorer when numbers are asked for."""
    if scoring_path(body):
        if body.max_new_tokens == 1 or body.logprobs is not None:
            await score_prompts(serve, choices, body)
        return
    await run_generations(choices, started or start_generations(serve, choices, body))
    if body.logprobs is not None:
        await score_choices(serve, choices, body.logprobs)


def start_generations(serve: ServeState, choices: list[Choice], body: CompletionRequest) -> Started:
    """Queue a generation per choice (all or none: a full queue cancels the ones queued);
    choice j of each prompt draws with seed + j."""
    started: Started = []
    sampling = body.sampling()
    try:
        for c in choices:
            request = serve.engine.generation(c.prompt, sampling.choice(c.index % body.n))
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
    nxt = body.max_new_tokens == 1
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
