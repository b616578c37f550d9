"""The sampling options as one value, `Sampling`, validated once for every way in: `gpt1 sample`'s
flags, the `/v1/generate` and `/v1/completions` bodies, and the recipes (`Sampler`,
`generate_stream`, `BatchedDecoder`).

It is built by keyword only (`Sampling(max_new_tokens=20, top_k=40)`) and handed down whole, to
the choice of each token too (`gpt1.inference.generate.filter_logits`). A new option is a field
and its rule here, its use in `filter_logits`, its flag (`gpt1.cli.options.add_sampling`) and its
type in the HTTP bodies (`gpt1.serve.schemas.SAMPLING_TYPES`, one declaration for both).

The rules (OpenAI's where it has one):
- `max_new_tokens`: a whole number >= 0.
- `temperature`: a finite number >= 0; 0 is greedy (argmax). A tiny positive temperature (1e-30)
  is used as given, and its limit is greedy too: `filter_logits` divides each logit's distance
  from the row's largest, so nothing overflows and the likeliest token(s) take all the
  probability. There is no upper bound (OpenAI's API stops at 2; higher only flattens more).
- `top_k`: None (off) or a whole number >= 1.
- `top_p`: None (off) or in (0, 1]; a tiny one keeps only the likeliest token (the first always
  stays).
- `seed`: None (a random one) or 0..2**64-1, what a torch generator takes. Choice j of a request
  for n choices uses seed + j (`choice(j)`): all of seed..seed+n-1 must be in range (`for_choices`).
Infinity and NaN are refused wherever a number is asked for.

A refusal is a `SamplingError` naming the field as this module spells it (`field`, `problem`);
each way in shows it in its client's spelling: `--top-p` on the command line, `top_p` over HTTP,
`max_tokens` in OpenAI's protocol (`problem(name, value)` checks one field alone, for the HTTP
bodies' validators).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from gpt1.errors import ConfigError

MAX_SEED = 2**64 - 1  # torch's generators take 64-bit seeds
SEED_RANGE = f"0..2**64-1 ({MAX_SEED})"


class SamplingError(ConfigError, ValueError):
    """A sampling option out of its range. A ValueError too, so that pydantic reports it as a
    validation error of the request body (with this error as its context)."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")

    def flag(self) -> ConfigError:
        """The same refusal in the words of the command line (`--top-p must be ...`)."""
        return ConfigError(f"--{self.field.replace('_', '-')} {self.problem}")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _max_new_tokens(value: Any) -> str | None:
    if not (_whole(value) and value >= 0):
        return f"must be a whole number >= 0, got {value}"
    return None


def _temperature(value: Any) -> str | None:
    if not (_number(value) and value >= 0):
        return f"must be a finite number >= 0 (0 is greedy), got {value}"
    return None


def _top_k(value: Any) -> str | None:
    if value is not None and not (_whole(value) and value >= 1):
        return f"must be a whole number >= 1, got {value}"
    return None


def _top_p(value: Any) -> str | None:
    if value is not None and not (_number(value) and 0 < value <= 1):
        return f"must be a number in (0, 1], got {value}"
    return None


def _seed(value: Any) -> str | None:
    if value is not None and not (_whole(value) and 0 <= value <= MAX_SEED):
        return f"must be a whole number in {SEED_RANGE}, got {value}"
    return None


RULES: dict[str, Callable[[Any], str | None]] = {
    "max_new_tokens": _max_new_tokens,
    "temperature": _temperature,
    "top_k": _top_k,
    "top_p": _top_p,
    "seed": _seed,
}


def problem(name: str, value: Any) -> str | None:
    """What is wrong with `value` for the sampling option `name` (None: nothing)."""
    return RULES[name](value)


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How a continuation is drawn (the rules are the module docstring's); refused on
    construction with a `SamplingError`. Keyword arguments only."""

    max_new_tokens: int = 50
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            wrong = problem(f.name, getattr(self, f.name))
            if wrong is not None:
                raise SamplingError(f.name, wrong)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_choices(self, n: int) -> Sampling:
        """Check that n choices can each have their own seed (seed + j, j < n)."""
        if self.seed is not None and self.seed + n - 1 > MAX_SEED:
            raise SamplingError(
                "seed",
                f"with n={n} choices the seeds {self.seed}..{self.seed + n - 1} are used; "
                f"the largest a choice may use is {MAX_SEED}",
            )
        return self

    def choice(self, j: int) -> Sampling:
        """The options of choice j of several: its own seed, seed + j."""
        return self if self.seed is None else replace(self, seed=self.seed + j)

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A random generator seeded with `seed` (a fresh random seed when there is none)."""
        generator = torch.Generator(device=device)
        generator.manual_seed(self.seed if self.seed is not None else torch.seed())
        return generator
