"""Dynamic batching: one worker thread owns the model; concurrent requests are run together.

Requests become `Job`s in a bounded queue. The worker takes the oldest job; a predict or score job
is joined by the other queued jobs of its kind (waiting at most `wait_s` for more to arrive,
up to `batch_tokens` tokens and `batch_items` examples), and the whole batch goes through one call
of the engine (one forward per batch on the unpadded path). Under load the queue fills while a
batch runs, so batches grow with load without any waiting; a request alone waits at most `wait_s`.

Generations advance a token per turn, interleaved with batches: between two batches every active
generation gets its next token from one step of the `Generations` (the engine, over its continuous
batching decoder, `gpt1.inference.batched.BatchedDecoder`: one forward pass for all of them), so a
long generation neither blocks classification nor starves, and concurrent generations share the
cost of reading the weights. At most `max_active_generations` run at once; the rest wait queued
(predict and score jobs behind them still run), and a generation whose client left is stopped
before the next step, or dropped from the queue, so its slot goes to the next. A generation alone
may get several tokens from a step (drafted from its text and verified); the drafted and accepted
tokens are reported to `on_batch` as a batch of kind "draft" (items: drafted, tokens: accepted).

Past `max_queue` queued items (examples, score pairs, generations) `submit` raises `QueueFull`
(the app answers 503 with Retry-After): memory stays bounded whatever the load. Results are
handed back to the event loop thread-safely; an exception in a batch fails that batch's requests
only, never the worker.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue holds `max_queue` items already: the request is refused (HTTP 503)."""


class Generations(Protocol):
    """What the worker needs to run generations (the engine, over its `BatchedDecoder`)."""

    def start(self, *request: Any) -> Any:
        """Begin a generation (a "generate" job's payload holds the arguments); returns its
        handle. Raises on a bad request."""

    def step(self) -> list[tuple[Any, Any]]:
        """One token for every started generation: (handle, token), then (handle, None) when it
        is finished, or (handle, exception) when it failed."""

    def stop(self, handle: Any) -> None:
        """Abandon a generation (its client left)."""


@dataclass
class Job:
    """One request's work: `payload` is a list of items for "predict"/"score", the arguments
    of `Generations.start` for "generate". `tokens` counts toward the batch budget, `items`
    toward the queue."""

    kind: str
    payload: Any
    tokens: int
    items: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future | None = None
    emit: Callable[[Any], None] | None = None  # generate: called per token, then with None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        jobs = _request_jobs.get()
        if jobs is not None:  # made while answering a request: its client may leave
            jobs.append(self)


# The jobs queued while answering one request (`request_jobs`), so that one rule, in the
# server's middleware, can cancel them all when the client leaves, whichever route made them.
_request_jobs: ContextVar[list[Job] | None] = ContextVar("request_jobs", default=None)


@contextmanager
def request_jobs() -> Iterator[list[Job]]:
    """Collect the jobs made in this block (and in the tasks it starts) into the list yielded;
    setting their `cancelled` stops queued ones from running and generations before their next
    step."""
    jobs: list[Job] = []
    token = _request_jobs.set(jobs)
    try:
        yield jobs
    finally:
        _request_jobs.reset(token)


class Batcher:
    """The worker thread and its queue (see the module docstring)."""

    def __init__(
        self,
        run_batch: Callable[[str, list[Any]], list[Any]],
        batch_tokens: int = 8192,
        batch_items: int = 16,
        wait_s: float = 0.002,
        max_queue: int = 1024,
        max_active_generations: int = 16,
        on_batch: Callable[[str, int, int], None] | None = None,
        generations: Generations | None = None,
    ):
        self.run_batch, self.batch_tokens, self.batch_items = run_batch, batch_tokens, batch_items
        self.wait_s, self.max_queue, self.max_active = wait_s, max_queue, max_active_generations
        self.on_batch = on_batch or (lambda kind, items, tokens: None)
        self._jobs: deque[Job] = deque()
        self._queued_items = 0
        self.generations = generations
        self._active: dict[Any, Job] = {}  # generation handle -> its job
        self._drafts = (0, 0)  # the generations' drafted and accepted tokens reported so far
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="gpt1-batcher", daemon=True)

    @property
    def queued_items(self) -> int:
        return self._queued_items

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish every queued and active job, then end the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue `job` or raise `QueueFull`; its future (or emit) receives the result."""
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if self._queued_items + job.items > self.max_queue:
                raise QueueFull(f"queue full ({self._queued_items} items waiting)")
            self._jobs.append(job)
            self._queued_items += job.items
            self._cond.notify()

    # ------------------------------------------------------------------ worker
    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                if not self._active:
                    return
            elif batch[0].kind == "generate":
                self._start_generations(batch)
            else:
                self._run(batch)
            self._step_generations()

    @property
    def active_generations(self) -> int:
        return len(self._active)

    def _next_batch(self) -> list[Job] | None:
        """The next jobs to run together; None when nothing can start now (after waiting,
        unless generations are active or the server stops)."""
        with self._cond:
            while True:
                first = self._take(lambda job: True)
                if first is not None or self._active or self._stopping:
                    break
                self._cond.wait()
            if first is None:  # nothing queued, or only generations waiting for room
                return None
            batch, tokens, items = [first], first.tokens, first.items
            if first.kind == "generate":
                while len(self._active) + len(batch) < self.max_active:
                    more = self._take(lambda job: job.kind == "generate")
                    if more is None:
                        break
                    batch.append(more)
            else:
                self._gather(batch, tokens, items)
            self._queued_items -= sum(job.items for job in batch)
            return batch

    def _take(self, wanted: Callable[[Job], bool]) -> Job | None:
        """Remove and return the oldest queued job that is `wanted` and can start now: a
        generation only while fewer than `max_active` run. Queued generations whose client
        left are dropped on the way."""
        full = len(self._active) >= self.max_active
        for job in list(self._jobs):
            if job.cancelled.is_set():
                self._jobs.remove(job)
                self._queued_items -= job.items
                continue
            if (job.kind == "generate" and full) or not wanted(job):
                continue
            self._jobs.remove(job)
            return job
        return None

    def _gather(self, batch: list[Job], tokens: int, items: int) -> None:
        """Add queued jobs of the batch's kind, within the batch bounds, waiting at most
        `wait_s` for more to arrive."""
        kind = batch[0].kind
        deadline = time.monotonic() + self.wait_s
        while True:
            for job in list(self._jobs):
                if job.cancelled.is_set():  # its client left while it waited
                    self._jobs.remove(job)
                    self._queued_items -= job.items
                    continue
                if job.kind != kind:
                    continue
                if tokens + job.tokens > self.batch_tokens or items + job.items > self.batch_items:
                    break
                self._jobs.remove(job)
                batch.append(job)
                tokens, items = tokens + job.tokens, items + job.items
            left = deadline - time.monotonic()
            if (
                left <= 0
                or self._stopping
                or tokens >= self.batch_tokens
                or items >= self.batch_items
            ):
                return
            self._cond.wait(left)

    def _run(self, batch: list[Job]) -> None:
        batch = [job for job in batch if not job.cancelled.is_set()]  # clients gone meanwhile
        if not batch:
            return
        kind = batch[0].kind
        flat = [item for job in batch for item in job.payload]
        try:
            results = self.run_batch(kind, flat)
        except Exception as exc:  # fail these requests, keep serving
            log.exception("batch of %d %s items failed", len(flat), kind)
            for job in batch:
                _resolve(job, exc=exc)
            return
        self.on_batch(kind, len(flat), sum(job.tokens for job in batch))
        start = 0
        for job in batch:
            _resolve(job, results[start : start + len(job.payload)])
            start += len(job.payload)

    def _start_generations(self, jobs: list[Job]) -> None:
        for job in jobs:
            try:
                if self.generations is None:
                    raise RuntimeError("this server runs no generations")
                self._active[self.generations.start(*job.payload)] = job
            except Exception as exc:
                _emit(job, exc)

    def _step_generations(self) -> None:
        """Advance every active generation by one token (drop finished or abandoned ones)."""
        for handle, job in list(self._active.items()):
            if job.cancelled.is_set():
                self.generations.stop(handle)  # the client left: free the cache now
                del self._active[handle]
        if not self._active:
            return
        try:
            events = self.generations.step()
            # A decoding step is a batch of "generate" items, one new token each.
            self.on_batch("generate", len(self._active), len(self._active))
            self._report_drafts()
        except Exception as exc:  # fail the generations, keep serving
            log.exception("generation step failed")
            for handle, job in self._active.items():
                self.generations.stop(handle)
                _emit(job, exc)
            self._active.clear()
            return
        for handle, item in events:
            job = self._active.get(handle)
            if job is None:
                continue
            if isinstance(item, BaseException):
                log.error("generation failed: %s", item)
            _emit(job, item)
            if item is None or isinstance(item, BaseException):
                del self._active[handle]

    def _report_drafts(self) -> None:
        """The tokens drafted (and accepted) since the last report, where the generations
        count them (a `Drafts` as their `drafts`)."""
        drafts = getattr(self.generations, "drafts", None)
        if drafts is None or drafts.drafted == self._drafts[0]:
            return
        seen, self._drafts = self._drafts, (drafts.drafted, drafts.accepted)
        self.on_batch("draft", drafts.drafted - seen[0], drafts.accepted - seen[1])


def _resolve(job: Job, result: Any = None, exc: BaseException | None = None) -> None:
    def settle() -> None:
        if job.future is not None and not job.future.done():
            if exc is not None:
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)

    job.loop.call_soon_threadsafe(settle)


def _emit(job: Job, item: Any) -> None:
    """Hand a token (or None: finished, or an exception) to the job's consumer."""
    if job.emit is not None:
        job.loop.call_soon_threadsafe(job.emit, item)
