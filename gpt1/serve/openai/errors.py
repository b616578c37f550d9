"""The OpenAI-compatible endpoints' refusals, in OpenAI's error object, which its clients read
(the SDK puts `message` in its exception): `{"error": {"message", "type", "param", "code"}}`.

Every status those endpoints answer goes through `OpenAIRoute`: a bad body (422, `param` is the
field as the client sent it), a `Refused` request, a user error, a full queue (503 with
`Retry-After`) and a bug (500, logged with its traceback).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from gpt1.errors import Gpt1Error
from gpt1.serve.batcher import QueueFull
from gpt1.serve.responses import RETRY_AFTER_S, error, validation_errors, validation_message

log = logging.getLogger("gpt1.serve")
FIELD = re.compile(r"^([a-z_][a-z_0-9]*(?:\.[a-z_0-9]+)*): ")  # `prompt.1: ...` names prompt.1


class Refused(Exception):
    """A request answered with `status` and a one-line message (`param`: the field at fault)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def openai_error(
    status: int,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """OpenAI's error object for `status` (`code` is the status, as vLLM's server sends it)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"message": " ".join(str(message).split()), "type": kind, "param": param, "code": status}
    return JSONResponse({"error": body}, status, headers=headers)


def refusal(
    openai: bool,
    status: int,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A refusal in its route's protocol: OpenAI's error object on the OpenAI-compatible routes
    (`openai`), gpt1's one line elsewhere."""
    if openai:
        return openai_error(status, message, param, headers)
    return error(status, message, headers)


def answer_failure(exc: Exception, path: str) -> JSONResponse:
    """The error response of an exception raised while answering a request on `path`."""
    if isinstance(exc, RequestValidationError):
        fields = [where for where, _ in validation_errors(exc) if where]
        return openai_error(422, validation_message(exc), fields[0] if fields else None)
    if isinstance(exc, Refused):
        return openai_error(exc.status, str(exc), exc.param)
    if isinstance(exc, Gpt1Error):  # its message starts with the field, as every refusal's
        field = FIELD.match(str(exc))
        return openai_error(422, str(exc), field.group(1) if field else None)
    if isinstance(exc, QueueFull):
        message = f"server busy: {exc}; retry later"
        return openai_error(503, message, headers={"Retry-After": str(RETRY_AFTER_S)})
    log.error("internal error on %s", path, exc_info=exc)
    return openai_error(500, f"internal error: {type(exc).__name__}: {exc}")


class OpenAIRoute(APIRoute):
    """A route whose every refusal and failure answers in OpenAI's error object."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException:  # the app's own (a body the JSON parser gave up on, ...)
                raise
            except Exception as exc:  # each kind is answered in answer_failure
                return answer_failure(exc, request.url.path)

        return answer
