"""The API's refusals as one line of JSON: `{"error": "<one line>"}` (the OpenAI-compatible
endpoints wrap the same words in OpenAI's shape, `gpt1.serve.openai.errors`).

A validation error names the field as the client sent it: `prompt.1`, `inputs.text`, `seed`,
never pydantic's own names for the branches of a union (`prompt.function-wrap[_check()]`).
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

RETRY_AFTER_S = 1  # what a 503 (queue full) asks the client to wait


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status, headers=headers)


def validation_errors(exc: RequestValidationError) -> list[tuple[str, str]]:
    """Pydantic's errors as (field, message), the field as the client spelled it ("" for the
    body as a whole), one per field and message."""
    body = getattr(exc, "body", None)
    errors = [e for e in exc.errors() if e.get("type") != "json_invalid"]
    if len(errors) < len(exc.errors()):
        return [("", "body is not valid JSON")]
    fitting = [e for e in errors if _fits(body, _loc(e))]
    out: list[tuple[str, str]] = []
    for e in fitting or errors:  # no branch of a union fits the value's shape: say all
        where, message = _client_field(body, _loc(e)), e.get("msg", "invalid")
        found = (e.get("ctx") or {}).get("error")
        if getattr(found, "field", None):  # a whole-object check naming its field
            where, message = ".".join(filter(None, [where, found.field])), found.problem
        item = (where, message.replace("Value error, ", ""))
        if item not in out:
            out.append(item)
    return out


def validation_message(exc: RequestValidationError) -> str:
    """`validation_errors` as one line: `inputs.0.text: Field required; ...`."""
    parts = [f"{where}: {msg}" if where else msg for where, msg in validation_errors(exc)]
    return "; ".join(parts[:5]) + (f" (and {len(parts) - 5} more)" if len(parts) > 5 else "")


def _loc(e: dict[str, Any]) -> list[Any]:
    loc = list(e.get("loc", ()))
    return loc[1:] if loc[:1] == ["body"] else loc


TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}  # pydantic's branch names


def _is_tag(value: Any, part: Any, last: bool) -> bool:
    """Whether `part` of a location is pydantic's name for a union's branch (or a validator),
    not a key or index of the client's `value`: a key the value does not have is a field only
    at the end of a location (a missing one)."""
    if isinstance(part, str) and ("[" in part or part in TYPE_NAMES):
        return True
    if isinstance(value, dict):
        return not (part in value or (last and isinstance(part, str)))
    if isinstance(value, list):
        return not isinstance(part, int)
    return True


def _fits(value: Any, loc: list[Any]) -> bool:
    """Whether every union branch named in `loc` takes values of `value`'s JSON shape (the
    branch a client meant: `list[int]` for a list of ids, a string's for a string)."""
    for i, part in enumerate(loc):
        if _is_tag(value, part, i == len(loc) - 1):
            if isinstance(part, str) and not _shape_fits(part, value):
                return False
            continue
        value = value[part] if isinstance(value, dict | list) and part in _keys(value) else None
    return True


def _keys(value: Any) -> Any:
    return value if isinstance(value, dict) else range(len(value))


def _shape_fits(tag: str, value: Any) -> bool:
    if isinstance(value, list):
        return tag.startswith("list[") and (not value or _shape_fits(tag[5:-1], value[0]))
    if tag.startswith("list["):
        return False
    if isinstance(value, bool) or not isinstance(value, int):
        return tag != "int"
    return tag == "int"


def _client_field(body: Any, loc: list[Any]) -> str:
    """`loc` without pydantic's branch names; `inputs.0` is `inputs` when `inputs` was one
    object (the schema validates it as a list of one)."""
    where, value = [], body
    for i, part in enumerate(loc):
        if _is_tag(value, part, i == len(loc) - 1):
            continue
        where.append(part)
        value = value[part] if part in _keys(value) else None
    one_item = isinstance(body, dict) and isinstance(body.get("inputs"), dict)
    if one_item and where[:2] == ["inputs", 0]:
        where = ["inputs", *where[2:]]
    return ".".join(str(p) for p in where)


def parse_failure(cause: BaseException) -> str:
    """Why JSON that the parser rejected (not a syntax error) failed, in a few words (never
    Python's own advice, such as sys.set_int_max_str_digits)."""
    if isinstance(cause, RecursionError):
        return "nested too deeply"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "a number with too many digits (at most 4300)"
    return " ".join(str(cause).split()).split("; use sys.")[0] or type(cause).__name__
