"""Request bodies of the OpenAI-compatible endpoints (`gpt1.serve.openai.routes`).

The completions body has OpenAI's fields and defaults (its legacy `/v1/completions` API, the one
vLLM, llama.cpp's server and lm-evaluation-harness's `local-completions` speak). Unknown fields
are refused like everywhere in this API; `user` is accepted and changes nothing; the fields
gpt1 cannot honour (`REFUSED`) are refused unless they hold their default, so a request never
gets an answer computed differently from what it asked.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from gpt1.inference.sampling import Sampling
from gpt1.serve.schemas import ERROR_RESPONSES, AtMost, FieldError, Text, sampling_options

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # strict still takes a JSON integer (0 for 0.0)
Bool = Annotated[bool, Strict()]
Ids = Annotated[list[Int], Field(min_length=1)]
StopText = Annotated[str, Strict(), Field(min_length=1, max_length=200)]

MAX_LOGPROBS = 5  # OpenAI's own limit for the completions API
DEFAULT_MAX_TOKENS = 16  # OpenAI's default
# OpenAI's defaults of the sampling options (top_p 1 keeps every token, as no top_p does).
OPENAI_SAMPLING = Sampling(max_new_tokens=DEFAULT_MAX_TOKENS, top_p=1.0)

# Field -> (its default values, why gpt1 refuses any other value).
REFUSED: dict[str, tuple[tuple[Any, ...], str]] = {
    "presence_penalty": ((None, 0, 0.0), "gpt1 samples without repetition penalties"),
    "frequency_penalty": ((None, 0, 0.0), "gpt1 samples without repetition penalties"),
    "best_of": ((None, 1), "gpt1 returns every sample it draws; ask for n samples instead"),
    "logit_bias": ((None, {}), "gpt1 samples from the model's own distribution"),
    "suffix": ((None, ""), "GPT-1 only continues text to the right (no insertion)"),
}


# Fields whose null means their default (clients send nulls for "not set"): the sampling
# options (by their names in `Sampling`) and these.
NULL_MEANS: dict[str, Any] = {**asdict(OPENAI_SAMPLING), "n": 1, "echo": False, "stream": False}


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Closed):
    include_usage: Bool = False


# The model and the prompt: a base of their own, first in the body's schema.
class CompletionPrompt(Closed):
    model: Annotated[str, Strict()] | None = None
    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1)]
        | Ids
        | Annotated[list[Ids], Field(min_length=1)]
    )


# The sampling options are /v1/generate's (`gpt1.serve.schemas.sampling_options`: gpt1's one rule,
# `gpt1.inference.sampling`), with OpenAI's defaults and names (`max_tokens`; `top_k` is vLLM's
# and gpt1 sample's), each taking null for its default.
OpenAISampling = sampling_options(
    OPENAI_SAMPLING, nullable=True, aliases={"max_new_tokens": "max_tokens"}
)


# The `/v1/completions` body (no docstring: it would become the schema's description).
class CompletionRequest(OpenAISampling, CompletionPrompt):
    n: Annotated[Int, Field(ge=1), AtMost("max_choices")] | None = 1
    stop: StopText | Annotated[list[StopText], Field(max_length=16)] | None = None
    logprobs: Annotated[Int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: Bool | None = False
    stream: Bool | None = False
    stream_options: StreamOptions | None = None
    user: Annotated[str, Strict()] | None = None  # accepted; changes nothing here
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    best_of: Int | None = None
    logit_bias: dict[str, Float] | None = None
    suffix: Annotated[str, Strict()] | None = None
    # vLLM's extension: answer with the likeliest of these strings (`gpt1.serve.openai.guided`)
    guided_choice: Annotated[list[Text], Field(min_length=1), AtMost("max_choices")] | None = None

    @model_validator(mode="after")
    def honourable(self) -> CompletionRequest:
        for name, (defaults, why) in REFUSED.items():
            if getattr(self, name) not in defaults:
                raise FieldError(name, f"only its default is supported ({why})")
        for name, default in NULL_MEANS.items():  # an explicit null is the default
            if getattr(self, name) is None:
                setattr(self, name, default)
        if self.max_new_tokens == 0 and not self.echo:
            raise FieldError("max_tokens", "0 returns nothing unless echo is true")
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "only with stream true")
        self.sampling().for_choices(self.n)  # choice j draws with seed + j
        return self

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts (texts or id lists)."""
        return [self.prompt] if self.one_prompt() else list(self.prompt)

    def prompt_fields(self) -> list[str]:
        """Each prompt's field as the client sent it: `prompt`, or `prompt.0`, `prompt.1`, ..."""
        return ["prompt"] if self.one_prompt() else [f"prompt.{i}" for i in range(len(self.prompt))]

    def one_prompt(self) -> bool:
        p = self.prompt
        return isinstance(p, str) or bool(p and isinstance(p[0], int))


class TokenizeRequest(Closed):
    model: Annotated[str, Strict()] | None = None
    prompt: Annotated[str, Strict(), AtMost("max_chars")]
    add_special_tokens: Bool = False  # GPT-1 adds none either way


class DetokenizeRequest(Closed):
    model: Annotated[str, Strict()] | None = None
    tokens: list[Int]


class OpenAIError(BaseModel):
    message: str = Field(description="what was wrong, in one line")
    type: str = Field(description="invalid_request_error (4xx) or server_error")
    code: int = Field(description="the HTTP status")


class OpenAIErrorBody(BaseModel):
    """The OpenAI endpoints' refusals, in the shape OpenAI's clients read."""

    error: OpenAIError


# As documented in the schema: the endpoints' own refusals in OpenAI's shape; a body too large or
# too slow is refused before it reaches them, in the rest of the API's shape.
OPENAI_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{s: {**r, "model": OpenAIErrorBody} for s, r in ERROR_RESPONSES.items()},
    **{
        status: {"model": OpenAIErrorBody, "description": what}
        for status, what in (
            (
                404,
                "another model than the served one, or chat completions (GPT-1 has no chat format)",
            ),
            (422, "invalid body: unknown or refused fields, wrong types, values out of range"),
        )
    },
}
