"""Server-sent events: the one streamed response of both protocols (`/v1/generate` and OpenAI's
`/v1/completions` with `"stream": true`).

Each event is one `data: <JSON>` line and a blank line, sent uncached; OpenAI's protocol ends
its stream with `data: [DONE]`, gpt1's own with its last event. The events come from an async
generator, which is closed as soon as the response ends, however it ends (finished, or the
client gone), after `on_close` has run: that is where a stream stops its generations, so nothing
is decoded for nobody.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse

DONE = "[DONE]"  # OpenAI's last event
# How a route that may stream documents its 200 answer: JSON, or these events.
STREAMED_OK = {
    200: {
        "description": "the answer; with `stream: true`, server-sent events",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}

# An event's data: an object, sent as JSON, or a text that is JSON already (an error response's
# body, written by its own encoder) or `[DONE]`.
Data = dict[str, Any] | str


def frame(data: Data) -> str:
    """One event as it goes on the wire."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


class EventStream(StreamingResponse):
    """A `text/event-stream` response of `events` (then `[DONE]` when `done`); `on_close` runs
    when the response ends, before `events` is closed."""

    def __init__(
        self,
        events: AsyncGenerator[Data, None],
        done: bool = False,
        on_close: Callable[[], None] | None = None,
    ):
        self.framed = _framed(events, done)
        super().__init__(
            self.framed, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self.events, self.on_close = events, on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.on_close is not None:
                self.on_close()
            await self.framed.aclose()  # closing a generator does not close what it iterates
            await self.events.aclose()


async def _framed(events: AsyncIterator[Data], done: bool) -> AsyncGenerator[str, None]:
    async for data in events:
        yield frame(data)
    if done:
        yield frame(DONE)
