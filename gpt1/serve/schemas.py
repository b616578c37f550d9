"""Request bodies (pydantic): unknown fields, wrong types and out-of-range values are refused.

The predict body is built per model (`predict_model`), so the OpenAPI page names the served
task's own fields (a user task's column names; `text`, `premise`/`hypothesis`,
`sentence1`/`sentence2` or `context`/`question`/`choices` for the built-in tasks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    create_model,
    field_validator,
    model_validator,
)


@dataclass
class Limits:
    """What one request may ask for; past these the answer is a 4xx naming the limit."""

    max_items: int = 64  # examples per predict request, pairs per score request
    max_chars: int = 20_000  # characters per text field
    max_new_tokens: int = 1024  # per generate request
    max_body_bytes: int = 1 << 20  # request body
    max_choices: int = 16


class Closed(BaseModel):
    """Unknown fields are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


# No coercion: "5" is not an int, 1 is not a string, "true" is not a bool; no Infinity or NaN.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Bool = Annotated[bool, Strict()]

# Sampling options whose float32 arithmetic breaks down below these (logits / temperature
# overflows; top_p rounds to 0 and drops every token): refused, not treated as greedy.
MIN_TEMPERATURE = 1e-4
MIN_TOP_P = 1e-6
MAX_SEED = 2**64 - 1  # torch's generators take 64-bit seeds


class ErrorBody(BaseModel):
    """What every error response carries."""

    error: str = Field(description="what was wrong, in one line")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": what}
    for status, what in (
        (408, "the request did not arrive within --request-timeout"),
        (413, "the body is over --max-body-bytes"),
        (422, "invalid body: unknown fields, wrong types, values out of range, invalid JSON"),
        (503, "the queue is full (see Retry-After)"),
    )
}


def predict_model(fields: dict[str, str], limits: Limits) -> type[BaseModel]:
    """The `/v1/predict` body for a task whose request fields map to roles `fields`."""
    text = Annotated[str, Strict(), Field(min_length=1, max_length=limits.max_chars)]
    specs: dict[str, Any] = {}
    for i, (name, role) in enumerate(fields.items()):
        if role == "choices":
            kind: Any = Annotated[list[text], Field(min_length=1, max_length=limits.max_choices)]
            specs[f"f{i}"] = (kind, Field(alias=name))
        elif role == "question":  # optional, may be empty (as in the task's files)
            specs[f"f{i}"] = (
                Annotated[str, Strict(), Field(max_length=limits.max_chars)],
                Field("", alias=name),
            )
        else:
            specs[f"f{i}"] = (text, Field(alias=name))
    item = create_model("PredictItem", __base__=Closed, **specs)

    class PredictRequest(Closed):
        inputs: Annotated[
            list[item],
            Field(
                min_length=1,
                max_length=limits.max_items,  # type: ignore[valid-type]
                description="one item or a list of items",
            ),
        ]

        @model_validator(mode="before")
        @classmethod
        def one_item(cls, data: Any) -> Any:
            """`{"inputs": {...}}` is the list of that one item."""
            if isinstance(data, dict) and isinstance(data.get("inputs"), dict):
                return {**data, "inputs": [data["inputs"]]}
            if isinstance(data, dict) and isinstance(data.get("inputs"), str):
                example = ", ".join(f'"{name}": "..."' for name in fields)
                raise ValueError(
                    "inputs: an object of the task's fields ({" + example + "}) or a list of "
                    "them, not a bare string"
                )
            return data

    return PredictRequest


def generate_model(limits: Limits) -> type[BaseModel]:
    """The `/v1/generate` body: `gpt1 sample`'s options, with the same defaults."""

    class GenerateRequest(Closed):
        prompt: (
            Annotated[str, Strict(), Field(min_length=1, max_length=limits.max_chars)] | None
        ) = None
        prompt_ids: Annotated[list[Int], Field(min_length=1)] | None = None
        max_new_tokens: Annotated[Int, Field(ge=0, le=limits.max_new_tokens)] = 50
        temperature: Annotated[
            Float, Field(ge=0.0, description=f"0 (greedy) or from {MIN_TEMPERATURE:g}")
        ] = 1.0
        top_k: Annotated[Int, Field(ge=1)] | None = None
        top_p: Annotated[Float, Field(ge=MIN_TOP_P, le=1.0)] | None = None
        seed: Annotated[Int, Field(ge=0, le=MAX_SEED)] | None = None
        stream: Bool = False

        @field_validator("temperature")
        @classmethod
        def usable_temperature(cls, value: float) -> float:
            if 0 < value < MIN_TEMPERATURE:
                raise ValueError(
                    f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {value:g}"
                )
            return value

        @model_validator(mode="after")
        def one_prompt(self) -> GenerateRequest:
            if (self.prompt is None) == (self.prompt_ids is None):
                raise ValueError("give exactly one of prompt or prompt_ids")
            return self

    return GenerateRequest


def score_model(limits: Limits) -> type[BaseModel]:
    """The `/v1/score` body: (context, continuation) pairs as texts or as token ids."""
    text = Annotated[str, Strict(), Field(min_length=1, max_length=limits.max_chars)]

    class ScoreItem(Closed):
        context: text | None = None
        continuation: text | None = None
        context_ids: Annotated[list[Int], Field(min_length=1)] | None = None
        continuation_ids: Annotated[list[Int], Field(min_length=1)] | None = None

        @model_validator(mode="after")
        def one_each(self) -> ScoreItem:
            if (self.context is None) == (self.context_ids is None):
                raise ValueError("give exactly one of context or context_ids")
            if (self.continuation is None) == (self.continuation_ids is None):
                raise ValueError("give exactly one of continuation or continuation_ids")
            return self

    class ScoreRequest(Closed):
        items: Annotated[list[ScoreItem], Field(min_length=1, max_length=limits.max_items)]

    return ScoreRequest
