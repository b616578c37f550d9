"""What the request handlers share, one per app: the engine, the batcher, the metrics, the
limits and the tokenizer thread (`ServeState`, kept as `app.state.serve`; a handler takes it
as a `Serve` parameter, a FastAPI dependency).

The model runs in the batcher's worker thread and tokenization in the tokenizer thread, so the
event loop only validates and waits: a long text never stalls the other requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request

from gpt1.serve.batcher import Batcher, Job
from gpt1.serve.engine import Engine, GenerationRequest, model_name
from gpt1.serve.metrics import Metrics
from gpt1.serve.schemas import Limits

SCORE_KIND = "sequence_logprobs"  # the OpenAI-compatible endpoints' scoring jobs


def run_batch(engine: Engine, micro: int, kind: str, items: list[Any]) -> list[Any]:
    """The batcher's work for a batch of `kind` (`micro`: examples per predict forward)."""
    if kind == "predict":
        return engine.predict(items, micro=micro)
    if kind == SCORE_KIND:
        return engine.sequence_logprobs(items)
    return engine.score(items)


def new_tokenizer_thread() -> ThreadPoolExecutor:
    # One thread: the tokenizer (its caches, spaCy) is not made for concurrent calls.
    return ThreadPoolExecutor(1, thread_name_prefix="gpt1-tokenize")


@dataclass
class ServeState:
    """One app's engine, batcher, metrics, limits and tokenizer thread."""

    engine: Engine
    batcher: Batcher
    metrics: Metrics
    limits: Limits
    model_id: str | None = None  # what the OpenAI endpoints call the model (None: its run's name)
    tokenizer_thread: ThreadPoolExecutor = field(default_factory=new_tokenizer_thread)
    created: int = field(init=False)  # when the model was made (its folder's time)

    def __post_init__(self) -> None:
        self.model_id = self.model_id or run_name(self.engine.folder)
        self.created = int(self.engine.folder.stat().st_mtime)

    async def off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in the tokenizer thread (its exceptions are raised here)."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_thread, fn, *args)

    async def run(self, kind: str, payload: list[Any], tokens: int) -> list[Any]:
        """The results of `payload`'s items, computed in a batch of `kind` (joined with other
        requests' items); `tokens` counts toward the batch's token budget."""
        loop = asyncio.get_running_loop()
        job = Job(kind, payload, tokens, len(payload), loop, future=loop.create_future())
        self.batcher.submit(job)
        self.metrics.queued.set(self.batcher.queued_items)
        return await job.future

    def generate(self, request: GenerationRequest) -> tuple[Job, AsyncGenerator[int, None]]:
        """Queue a generation (or raise `QueueFull`): its job, and its new tokens as they come.
        Closing the iterator (or leaving it) stops the generation before its next step."""
        tokens: asyncio.Queue = asyncio.Queue()
        job = Job(
            "generate",
            request,
            len(request.prompt_ids),
            1,
            asyncio.get_running_loop(),
            emit=tokens.put_nowait,
        )
        self.batcher.submit(job)
        return job, self._new_tokens(job, tokens)

    async def _new_tokens(self, job: Job, tokens: asyncio.Queue) -> AsyncGenerator[int, None]:
        try:
            while (item := await tokens.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                self.metrics.generated.inc()
                yield item
        finally:
            job.cancelled.set()  # no-op when finished; frees the worker if the client left


def run_name(folder: Path) -> str:
    """A served model's name: its run's for the run's final model (`runs/sst2/final` ->
    `sst2`), `run/checkpoint` for another of its checkpoints (`pretrain/step-500`), the
    folder's own name for a checkpoint folder of its own."""
    return folder.parent.name if folder.name == "final" else model_name(folder)


def serve_state(request: Request) -> ServeState:
    return request.app.state.serve


Serve = Annotated[ServeState, Depends(serve_state)]
