"""`gpt1 sample`: a checkpoint's tokenizer and model, ready for prompt after prompt.

`Sampler` holds a loaded checkpoint (GPT or the LSTM baseline) and its tokenizer; its `stream` and
`draw` take the sampling options as one `Sampling` (`Sampling(max_new_tokens=20, top_k=40)`), as
does `sample(checkpoint, ...)`, the one-shot entry point. The generation itself is
`gpt1.inference.generate`, inside the checkpoint's window (`Loaded.window`, the one `gpt1 serve`
reports): past it each new token re-reads the window, about 100x slower at GPT-1's size, which
`Sampler` warns about up front and again when it happens. `Sampler.speed` is the
last generation's tokens and time (`gpt1 sample` prints it), with the drafted tokens accepted
where one sequence was decoded speculatively (`speculate`: by default when greedy).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt1.errors import CheckpointError, ConfigError
from gpt1.inference.generate import TextStream, generate_stream
from gpt1.inference.loading import Loaded, load_for_inference
from gpt1.inference.sampling import Sampling
from gpt1.inference.speculative import Drafts, Speculator, wanted
from gpt1.model.gpt import GPT
from gpt1.model.memory import ensure_fits

log = logging.getLogger(__name__)


@dataclass
class Sample:
    ids: list[int]  # prompt + continuation
    prompt_len: int
    text: str | None  # decoded continuation, when the checkpoint has a tokenizer


@dataclass(frozen=True)
class Speed:
    """One generation's size and time: prefill and decoding, the load excluded."""

    prompt_tokens: int
    new_tokens: int  # of every sample together
    seconds: float
    drafts: Drafts | None = None  # where tokens were drafted and verified (`speculate`)

    def __str__(self) -> str:
        rate = self.new_tokens / self.seconds if self.seconds > 0 else float("inf")
        drafted = f"; {self.drafts}" if self.drafts is not None else ""
        return (
            f"{self.prompt_tokens} prompt tokens, {self.new_tokens} new tokens in "
            f"{self.seconds:.2f} s ({rate:.1f} tokens/s){drafted}"
        )


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
        self,
        checkpoint: str | Path | Loaded,
        device: str | torch.device = "auto",
        precision: str = "auto",
        speculate: str = "auto",
    ):
        """Load `checkpoint` (`load_for_inference`), or take one loaded already. `speculate`:
        verify tokens drafted from the text several at a time (`gpt1.inference.speculative`):
        "auto" when greedy (the same tokens), "on" when sampling too (the same distribution,
        not the same draws for a seed), "off"."""
        wanted(speculate, Sampling())  # a mode it does not know is refused before loading
        loaded = (
            checkpoint
            if isinstance(checkpoint, Loaded)
            else load_for_inference(checkpoint, device, precision)
        )
        self.folder, self.device = loaded.checkpoint.folder, loaded.device
        self.model, self.tokenizer = loaded.lm, loaded.tokenizer
        # The ids its tokenizer decodes: a model with more rows than that is sampled among these.
        self.vocab = len(self.tokenizer) if self.tokenizer is not None else None
        # The positions it was trained on (`gpt1 serve` refuses requests past them).
        self.window = loaded.window
        self.speed: Speed | None = None  # the last generation's
        self.speculate = speculate

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
                else "the window the model was trained on"
            )
            log.warning(
                "prompt has %d tokens; keeping the last %d (%s)", len(prompt_ids), n_pos, what
            )
            prompt_ids = prompt_ids[-n_pos:]
        return list(prompt_ids)

    def _warn_past_window(self, prompt_tokens: int, sampling: Sampling) -> None:
        """Say so up front where the prompt and the new tokens run past the model's window
        (`gpt1 serve` refuses such a request; sampling, which explores, goes on)."""
        end = prompt_tokens + sampling.max_new_tokens
        if end > self.window:
            log.warning(
                "the prompt and %d new tokens reach position %d, past the %d-token window this "
                "model was trained on: from there each new token re-reads the window (much "
                "slower); ask for at most %d new tokens to stay inside it",
                sampling.max_new_tokens,
                end,
                self.window,
                max(self.window - prompt_tokens, 0),
            )

    def _steps(self, ids: torch.Tensor, sampling: Sampling) -> Iterator[torch.Tensor]:
        """`generate_stream` inside the window, timed into `speed`; warns once, when it
        happens, that decoding passed the window and re-reads it from then on."""
        start, warned = time.perf_counter(), False
        speculator = None
        if ids.shape[0] == 1 and isinstance(self.model, GPT):  # one sequence with a cache
            speculator = Speculator.wanted(self.speculate, sampling, ids[0].tolist(), Drafts())
        drafts = speculator.counts if speculator is not None else None
        self.speed = Speed(ids.shape[1], 0, 0.0, drafts)
        steps = generate_stream(
            self.model,
            ids,
            sampling,
            self._generator(sampling),
            window=self.window,
            vocab=self.vocab,
            speculator=speculator,
        )
        for n, step in enumerate(steps, 1):
            elapsed = time.perf_counter() - start
            self.speed = Speed(ids.shape[1], n * ids.shape[0], elapsed, drafts)
            yield step
            if not warned and ids.shape[1] + n > self.window and n < sampling.max_new_tokens:
                warned = True
                log.warning(
                    "position %d: generation passed the %d-token window; each new token now "
                    "re-reads the last %d tokens (slower)",
                    ids.shape[1] + n,
                    self.window,
                    self.window,
                )

    def stream(self, prompt_ids: list[int], sampling: Sampling) -> Iterator[str]:
        """The continuation's text, piece by piece as tokens are produced (needs a tokenizer);
        joined, the pieces equal `Tokenizer.decode` of the new ids."""
        if self.tokenizer is None:
            raise CheckpointError(f"{self.folder}: no tokenizer files, so text cannot be streamed")
        self._warn_past_window(len(prompt_ids), sampling)  # now, before any text is shown
        return self._pieces(prompt_ids, sampling)

    def _pieces(self, prompt_ids: list[int], sampling: Sampling) -> Iterator[str]:
        text = TextStream(self.tokenizer)
        for step in self._steps(torch.tensor([prompt_ids], device=self.device), sampling):
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
        ids = torch.tensor([prompt_ids] * num_samples, dtype=torch.long, device=self.device)
        self._warn_past_window(len(prompt_ids), sampling)
        out = torch.cat([ids, *self._steps(ids, sampling)], dim=1).tolist()
        n = len(prompt_ids)
        return [
            Sample(row, n, self.tokenizer.decode(row[n:]) if self.tokenizer else None)
            for row in out
        ]

    def _generator(self, sampling: Sampling) -> torch.Generator:
        return sampling.generator(self.device)  # seeded, or with a fresh random seed


def sample(
    checkpoint: str | Path,
    prompt: str | None = None,
    prompt_ids: list[int] | None = None,
    sampling: Sampling = Sampling(),
    num_samples: int = 1,
    device: str = "auto",
    precision: str = "auto",
) -> list[Sample]:
    """Load `checkpoint` and continue a text or id prompt `num_samples` times, drawn with
    `sampling` (the options are checked before anything loads)."""
    if (prompt is None) == (prompt_ids is None):
        raise ConfigError('give exactly one of --prompt TEXT or --prompt-ids "1 2 3"')
    if num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {num_samples}")
    sampler = Sampler(checkpoint, device, precision)
    return sampler.draw(sampler.prompt_ids(prompt, prompt_ids), sampling, num_samples)
