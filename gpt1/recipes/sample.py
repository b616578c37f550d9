"""`gpt1 sample`: a checkpoint's tokenizer and model, ready for prompt after prompt.

`Sampler` holds a loaded checkpoint (GPT or the LSTM baseline) and its tokenizer; its `stream` and
`draw` take the sampling options as one `Sampling` (`stream_text` and `samples` are the same with
the options spelled out). `sample(checkpoint, ...)` is the one-shot entry point. The generation
itself is `gpt1.inference.generate`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt1.errors import CheckpointError, ConfigError
from gpt1.inference.generate import TextStream, generate_stream, sample_ids
from gpt1.inference.loading import Loaded, load_for_inference
from gpt1.inference.sampling import Sampling
from gpt1.model.memory import ensure_fits

log = logging.getLogger(__name__)


@dataclass
class Sample:
    ids: list[int]  # prompt + continuation
    prompt_len: int
    text: str | None  # decoded continuation, when the checkpoint has a tokenizer


def parse_ids(raw: str) -> list[int]:
    """ "1 2 3" or "1,2,3" -> [1, 2, 3]."""
    try:
        return [int(t) for t in raw.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(
            f"--prompt-ids must be integers separated by spaces, got {raw!r}"
        ) from None


def check_sampling_memory(config: Any, num_samples: int, max_new_tokens: int, device: str) -> None:
    """Refuse `--num-samples` x context that cannot fit: per sequence, at least one float32
    hidden state per position and layer and one row of logits."""
    window = min(config.n_positions, max_new_tokens + 1)  # the prompt holds at least one token
    need = num_samples * (window * config.n_embd * config.n_layer + config.vocab_size) * 4
    ensure_fits(
        need,
        "sampling",
        "--num-samples",
        f"num_samples={num_samples:,} x {window:,} "
        f"positions x n_layer={config.n_layer} x n_embd={config.n_embd}",
        device,
    )


class Sampler:
    """A loaded checkpoint (GPT or the LSTM baseline) and its tokenizer, ready for prompt after
    prompt (`gpt1 sample --interactive` keeps one open)."""

    def __init__(
        self, checkpoint: str | Path | Loaded, device: str = "auto", precision: str = "auto"
    ):
        """Load `checkpoint` (`load_for_inference`), or take one loaded already."""
        loaded = (
            checkpoint
            if isinstance(checkpoint, Loaded)
            else load_for_inference(checkpoint, device, precision)
        )
        self.folder, self.device = loaded.checkpoint.folder, loaded.device
        self.model, self.tokenizer = loaded.lm, loaded.tokenizer
        # The positions its pretraining trained (`gpt1 serve` refuses requests past them).
        self.window = loaded.window

    def prompt_ids(
        self, prompt: str | None = None, prompt_ids: list[int] | None = None
    ) -> list[int]:
        """The ids to continue: `prompt` encoded, or `prompt_ids`, cut to the last `window`
        (n_positions, or the shorter window the model was pretrained on)."""
        if (prompt is None) == (prompt_ids is None):
            raise ConfigError('give exactly one of --prompt TEXT or --prompt-ids "1 2 3"')
        if prompt is not None:
            if self.tokenizer is None:
                raise CheckpointError(
                    f"{self.folder}: no tokenizer files (vocab.json + merges.txt), "
                    "so a text prompt cannot be encoded; use --prompt-ids"
                )
            prompt_ids = list(self.tokenizer.encode(prompt))
        n_pos = self.window
        if len(prompt_ids) > n_pos:
            what = (
                "n_positions"
                if n_pos == self.model.config.n_positions
                else "the window the model was pretrained on"
            )
            log.warning(
                "prompt has %d tokens; keeping the last %d (%s)", len(prompt_ids), n_pos, what
            )
            prompt_ids = prompt_ids[-n_pos:]
        return list(prompt_ids)

    def _warn_past_window(self, prompt_tokens: int, sampling: Sampling) -> None:
        """Say so where the prompt and the new tokens run past the positions the model was
        pretrained on: those position rows were never trained (`gpt1 serve` refuses such a
        request; sampling, which explores, goes on)."""
        end = prompt_tokens + sampling.max_new_tokens
        if self.window < self.model.config.n_positions and end > self.window:
            log.warning(
                "the prompt and %d new tokens reach position %d, past the %d-token window this "
                "model was pretrained on (its later position rows are untrained); ask for at "
                "most %d new tokens to stay inside it",
                sampling.max_new_tokens,
                end,
                self.window,
                max(self.window - prompt_tokens, 0),
            )

    def stream(self, prompt_ids: list[int], sampling: Sampling) -> Iterator[str]:
        """The continuation's text, piece by piece as tokens are produced (needs a tokenizer);
        joined, the pieces equal `Tokenizer.decode` of the new ids."""
        if self.tokenizer is None:
            raise CheckpointError(f"{self.folder}: no tokenizer files, so text cannot be streamed")
        text = TextStream(self.tokenizer)
        self._warn_past_window(len(prompt_ids), sampling)
        steps = generate_stream(
            self.model, torch.tensor([prompt_ids]), sampling, self._generator(sampling)
        )
        for step in steps:
            piece = text.push(int(step[0, 0]))
            if piece:
                yield piece
        if end := text.flush():
            yield end

    def draw(self, prompt_ids: list[int], sampling: Sampling, num_samples: int = 1) -> list[Sample]:
        """`num_samples` continuations of the same prompt, generated as one batch."""
        if num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {num_samples}")
        check_sampling_memory(
            self.model.config, num_samples, sampling.max_new_tokens, str(self.device)
        )
        ids = torch.tensor([prompt_ids] * num_samples, dtype=torch.long)
        self._warn_past_window(len(prompt_ids), sampling)
        out = sample_ids(self.model, ids, sampling, self._generator(sampling))
        n = len(prompt_ids)
        return [
            Sample(row, n, self.tokenizer.decode(row[n:]) if self.tokenizer else None)
            for row in out.tolist()
        ]

    def _generator(self, sampling: Sampling) -> torch.Generator:
        return sampling.generator(self.device)  # seeded, or with a fresh random seed

    # The options spelled out (the README's example and programs written against it).
    def stream_text(
        self,
        prompt_ids: list[int],
        max_new_tokens: int = 50,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> Iterator[str]:
        """`stream` with the options spelled out."""
        sampling = Sampling(max_new_tokens, temperature, top_k, top_p, seed)
        return self.stream(prompt_ids, sampling)

    def samples(
        self,
        prompt_ids: list[int],
        max_new_tokens: int = 50,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        num_samples: int = 1,
    ) -> list[Sample]:
        """`draw` with the options spelled out."""
        sampling = Sampling(max_new_tokens, temperature, top_k, top_p, seed)
        return self.draw(prompt_ids, sampling, num_samples)


def sample(
    checkpoint: str | Path,
    prompt: str | None = None,
    prompt_ids: list[int] | None = None,
    max_new_tokens: int = 50,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    num_samples: int = 1,
    device: str = "auto",
    precision: str = "auto",
) -> list[Sample]:
    """Load `checkpoint` and continue a text or id prompt `num_samples` times (the options are
    checked before anything loads)."""
    sampling = Sampling(max_new_tokens, temperature, top_k, top_p, seed)
    if (prompt is None) == (prompt_ids is None):
        raise ConfigError('give exactly one of --prompt TEXT or --prompt-ids "1 2 3"')
    if num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {num_samples}")
    sampler = Sampler(checkpoint, device, precision)
    return sampler.draw(sampler.prompt_ids(prompt, prompt_ids), sampling, num_samples)
