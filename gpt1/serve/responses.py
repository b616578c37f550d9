"""The API's refusals as one line of JSON: `{"error": "<one line>"}` (the OpenAI-compatible
endpoints wrap the same words in OpenAI's shape, `gpt1.serve.completions`)."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status, headers=headers)


def validation_message(exc: RequestValidationError) -> str:
    """Pydantic's errors as one line: `inputs.0.text: Field required; ...`, each field named as
    the client sent it (`inputs.text` when `inputs` was one object, which the schema validates
    as a list of one)."""
    body = getattr(exc, "body", None)
    one_item = isinstance(body, dict) and isinstance(body.get("inputs"), dict)
    parts = []
    for e in exc.errors():
        where = [p for p in e.get("loc", ()) if p != "body"]
        if one_item and where[:2] == ["inputs", 0]:
            where = ["inputs", *where[2:]]
        loc = ".".join(str(p) for p in where)
        if e.get("type") == "json_invalid":
            parts.append("body is not valid JSON")
            continue
        msg = e.get("msg", "invalid").replace("Value error, ", "")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts[:5]) + (f" (and {len(parts) - 5} more)" if len(parts) > 5 else "")


def parse_failure(cause: BaseException) -> str:
    """Why JSON that the parser rejected (not a syntax error) failed, in a few words."""
    if isinstance(cause, RecursionError):
        return "nested too deeply"
    return " ".join(str(cause).split()) or type(cause).__name__
