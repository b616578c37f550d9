"""Request bodies (pydantic): unknown fields, wrong types and out-of-range values are refused.

The bodies are classes of this module, except the predict body, which is built per model
(`predict_model`) because its fields are the served task's own (a user task's column names;
`text`, `premise`/`hypothesis`, `sentence1`/`sentence2` or `context`/`question`/`choices` for
the built-in tasks), and both the OpenAPI page and the validation must name them.

The bounds a server is started with (`Limits`: --max-items, --max-new-tokens, ...) are marked
`AtMost("<limit>")` in the bodies: the value is checked against the limits of the app handling
the request (`limits_in_force`, which the app's middleware sets per request), with pydantic's own
error, and the app's OpenAPI schema shows that app's bound. Several apps in one process (the
tests) each keep their own limits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PrivateAttr,
    Strict,
    create_model,
    model_validator,
)
from pydantic_core import CoreSchema, PydanticKnownError, core_schema

from gpt1.inference.sampling import Sampling, problem

DEFAULTS = Sampling()  # gpt1 sample's defaults, /v1/generate's too


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; past these the answer is a 4xx naming the limit."""

    max_items: int = 64  # examples per predict request, pairs per score request
    max_chars: int = 20_000  # characters per text field
    max_new_tokens: int = 1024  # per generate request
    max_body_bytes: int = 1 << 20  # request body
    max_choices: int = 16


DEFAULT_LIMITS = Limits()
_in_force: ContextVar[Limits] = ContextVar("gpt1_serve_limits", default=DEFAULT_LIMITS)


@contextmanager
def limits_in_force(limits: Limits) -> Iterator[None]:
    """Validate the request bodies handled inside this block (and write the OpenAPI schema)
    against `limits`."""
    token = _in_force.set(limits)
    try:
        yield
    finally:
        _in_force.reset(token)


@dataclass(frozen=True)
class AtMost:
    """`Annotated[T, AtMost("max_items")]`: at most the limit of that name in force. A list's
    length is checked before its items (as pydantic's `max_length` does), a number or a string
    after its type; the errors are pydantic's own."""

    limit: str

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_wrap_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        out = handler(schema)
        key = {"array": "maxItems", "string": "maxLength", "integer": "maximum"}[out["type"]]
        out[key] = self._bound()
        return out

    def _bound(self) -> int:
        return getattr(_in_force.get(), self.limit)

    def _check(self, value: Any, validate: core_schema.ValidatorFunctionWrapHandler) -> Any:
        bound = self._bound()
        if isinstance(value, list) and len(value) > bound:
            context = {"field_type": "List", "max_length": bound, "actual_length": len(value)}
            raise PydanticKnownError("too_long", context)
        value = validate(value)
        if isinstance(value, str) and len(value) > bound:
            raise PydanticKnownError("string_too_long", {"max_length": bound})
        if isinstance(value, int) and value > bound:
            raise PydanticKnownError("less_than_equal", {"le": bound})
        return value


class FieldError(ValueError):
    """A whole-body check's refusal naming its field: the error shows it at that field
    (`gpt1.serve.responses.validation_errors`), as a `SamplingError` is shown."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


class Closed(BaseModel):
    """Unknown fields are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


# No coercion: "5" is not an int, 1 is not a string, "true" is not a bool; no Infinity or NaN.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Bool = Annotated[bool, Strict()]
Ids = Annotated[list[Int], Field(min_length=1)]
Text = Annotated[str, Strict(), Field(min_length=1), AtMost("max_chars")]

Number = Annotated[float, Strict()]  # a sampling option's: Infinity and NaN are refused by its rule


def sampling_rule(name: str) -> AfterValidator:
    """`Annotated[T, sampling_rule("top_p")]`: the `Sampling` rule of that option
    (`gpt1.inference.sampling`), the one `gpt1 sample` and both HTTP protocols apply; its problem
    is pydantic's error at the field, so the field is named as the client sent it."""

    def check(value: Any) -> Any:
        wrong = problem(name, value)
        if wrong is not None:
            raise ValueError(wrong)
        return value

    return AfterValidator(check)


# Each sampling option's type in a request body, declared once for both bodies that take them
# (/v1/generate's and OpenAI's /v1/completions: `sampling_options`), which add its `Sampling` rule.
# A new field of `Sampling` is declared here: until it is, the bodies fail to build.
SAMPLING_TYPES: dict[str, Any] = {
    "max_new_tokens": Annotated[Int, AtMost("max_new_tokens")],
    "temperature": Number,
    "top_k": Int,
    "top_p": Number,
    "seed": Int,
}


class SamplingOptions(Closed):
    """A body with `Sampling`'s fields (`sampling_options` declares them)."""

    def sampling(self) -> Sampling:
        """The body's options as one `Sampling`."""
        return Sampling(**{option.name: getattr(self, option.name) for option in fields(Sampling)})


def sampling_options(
    defaults: Sampling,
    nullable: bool = False,
    aliases: dict[str, str] | None = None,
    descriptions: dict[str, str] | None = None,
) -> type[SamplingOptions]:
    """A base class for a body taking every field of `Sampling` (of its `SAMPLING_TYPES` type,
    checked by its `sampling_rule`), with `defaults`' values by default. A field whose default is
    None also takes null; with `nullable`, every field does (the body reads a null as the
    default). `aliases`: a field's name in the body's protocol (OpenAI's `max_tokens`), which
    the body is sent and its errors say; `descriptions`: shown in the OpenAPI schema. The body
    lists its own fields after the ones of its other bases (`class Body(options, Prompt)`)."""
    aliases, descriptions = aliases or {}, descriptions or {}
    specs: dict[str, Any] = {}
    for option in fields(Sampling):
        name, default = option.name, getattr(defaults, option.name)
        kind: Any = Annotated[SAMPLING_TYPES[name], sampling_rule(name)]
        if nullable or default is None:
            kind = kind | None
        info = Field(default, alias=aliases.get(name), description=descriptions.get(name))
        specs[name] = (kind, info)
    return create_model("SamplingOptions", __base__=SamplingOptions, **specs)


class ErrorBody(BaseModel):
    """What every error response carries."""

    error: str = Field(description="what was wrong, in one line")


# What the server's gate (gpt1.serve.security) answers on any route before the route runs.
GATE_STATUSES = (
    (401, "the server has an API key and the request did not send it (Authorization: Bearer)"),
    (403, "a Host that does not name this server, or an Origin it does not allow"),
)
GATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what} for status, what in GATE_STATUSES
}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        *GATE_STATUSES,
        (408, "the request did not arrive within --request-timeout"),
        (413, "the body is over --max-body-bytes"),
        (415, "the body is not declared Content-Type: application/json"),
        (422, "invalid body: unknown fields, wrong types, values out of range, invalid JSON"),
        (503, "the queue is full (see Retry-After)"),
    )
}


def predict_model(fields: dict[str, str]) -> type[BaseModel]:
    """The `/v1/predict` body for a task whose request fields map to roles `fields`."""
    specs: dict[str, Any] = {}
    for i, (name, role) in enumerate(fields.items()):
        if role == "choices":
            choices = Annotated[list[Text], Field(min_length=1), AtMost("max_choices")]
            specs[f"f{i}"] = (choices, Field(alias=name))
        elif role == "question":  # optional, may be empty (as in the task's files)
            question = Annotated[str, Strict(), AtMost("max_chars")]
            specs[f"f{i}"] = (question, Field("", alias=name))
        else:
            specs[f"f{i}"] = (Text, Field(alias=name))
    item = create_model("PredictItem", __base__=Closed, **specs)
    inputs = Annotated[list[item], Field(min_length=1), AtMost("max_items")]
    body = create_model(
        "PredictRequest",
        __base__=PredictBody,
        inputs=(inputs, Field(description="one item or a list of items")),
    )
    body.field_names = list(fields)
    return body


# What every task's predict body shares: `inputs`, one item or a list of them (each task's
# body, `predict_model`, declares the items' own class).
class PredictBody(Closed):
    inputs: list[BaseModel]
    field_names: ClassVar[list[str]] = []  # the task's request fields
    _sent_one: bool = PrivateAttr(default=False)  # `inputs` was one object, not a list

    @model_validator(mode="wrap")
    @classmethod
    def one_item(cls, data: Any, handler: Any) -> Any:
        """`{"inputs": {...}}` is the list of that one item (and its errors say `inputs.x`)."""
        one = isinstance(data, dict) and isinstance(data.get("inputs"), dict)
        if one:
            data = {**data, "inputs": [data["inputs"]]}
        if isinstance(data, dict) and isinstance(data.get("inputs"), str):
            example = ", ".join(f'"{name}": "..."' for name in cls.field_names)
            raise ValueError(
                "inputs: an object of the task's fields ({" + example + "}) or a list of "
                "them, not a bare string"
            )
        body = handler(data)
        body._sent_one = one
        return body

    @property
    def sent_one(self) -> bool:
        return self._sent_one


# The prompt fields: a base of their own, first in the body's schema.
class GeneratePrompt(Closed):
    prompt: Text | None = None
    prompt_ids: Ids | None = None


# The `/v1/generate` body: the prompt, `gpt1 sample`'s options with the same defaults, `stream`.
# (The bodies carry no docstring: it would become the description in their schema.)
class GenerateRequest(
    sampling_options(DEFAULTS, descriptions={"temperature": "0 is greedy"}), GeneratePrompt
):
    stream: Bool = False

    @model_validator(mode="after")
    def one_prompt(self) -> GenerateRequest:
        if (self.prompt is None) == (self.prompt_ids is None):
            raise FieldError("prompt", "give exactly one of prompt or prompt_ids")
        return self


class ScoreItem(Closed):
    context: Text | None = None
    continuation: Text | None = None
    context_ids: Ids | None = None
    continuation_ids: Ids | None = None

    @model_validator(mode="after")
    def one_each(self) -> ScoreItem:
        if (self.context is None) == (self.context_ids is None):
            raise FieldError("context", "give exactly one of context or context_ids")
        if (self.continuation is None) == (self.continuation_ids is None):
            raise FieldError("continuation", "give exactly one of continuation or continuation_ids")
        return self


# The `/v1/score` body: (context, continuation) pairs as texts or as token ids.
class ScoreRequest(Closed):
    items: Annotated[list[ScoreItem], Field(min_length=1), AtMost("max_items")]
