"""Text generation: greedy, temperature, top-k and top-p (nucleus) sampling, with a KV cache.

`generate_stream(model, ids, sampling)` is the core (one step at a time, the options one
`Sampling`); `sample_ids` runs it to the end, and `generate` is the same with the options as
keywords (the one call that takes them so); `TextStream` turns the ids into text as they come.
`choose`, `next_tokens` and `filter_logits` are the choice of each token, each taking the
`Sampling` whole, shared with the batched decoder (`gpt1.inference.batched`) and speculative
decoding (`gpt1.inference.speculative`). The context is capped at `window` (default
`n_positions`; `gpt1 sample` passes the window the model was trained on): past it, each step
re-reads the last `window` tokens (learned positions cannot slide, so the cache is not reused
there), which is far slower.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from gpt1.errors import ConfigError, Gpt1Error
from gpt1.inference import backend, int8_step
from gpt1.inference.decoding import KVCache, forward_cached, prepare_to_decode
from gpt1.inference.sampling import Sampling
from gpt1.model.gpt import GPT


def filter_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Scale by `sampling`'s temperature (not 0: a greedy choice is no draw), then keep its top-k
    and the smallest top-p nucleus (others -inf).

    logits `[B, V]`; same order as transformers (temperature, top-k, top-p), so seeded samples
    follow the same distribution.
    """
    temperature, top_k, top_p = sampling.temperature, sampling.top_k, sampling.top_p
    scaled = logits / temperature
    if not all_finite(scaled):  # one pass; the rows told apart only where one overflows
        finite = torch.isfinite(scaled).all(-1, keepdim=True)  # [B, 1]
        # So small a temperature that logits / temperature overflows (or is 0 in float32):
        # divide the distances from the row's largest logit instead (softmax, top-k and top-p
        # are unchanged by the shift), keeping the largest at 0 rather than 0 / 0. Only such
        # rows: each row's result is the one it gets alone, whatever rows share its call.
        shifted = logits - logits.amax(-1, keepdim=True)
        scaled = torch.where(
            finite, scaled, torch.where(shifted < 0, shifted / temperature, shifted)
        )
    logits = scaled
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        # `where` rather than `masked_fill`: the same values, in half the time on one core
        logits = torch.where(logits < kth, float("-inf"), logits)
    if top_p is not None and top_p < 1.0:
        logits = torch.where(nucleus(logits, top_p), logits, float("-inf"))
    return logits


def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens of each row of `logits` `[B, V]` the top-p nucleus keeps (bool `[B, V]`):
    ranked by probability, a token stays unless the tokens ranked above it already reach
    `top_p`; the likeliest always stays (a `top_p` too small for float32 drops it otherwise).

    Ranking a whole row is what costs (`_ranking`: about 1.1 ms for GPT-1's 40,478 logits on
    one core), and only the head of the ranking can stay. `_head_size` tells how many of the
    likeliest tokens hold `top_p` between them; those are ranked alone (`torch.topk`) and, once
    their cumulative sum is seen to reach `top_p` (float32 rounds, so it is checked), every
    token past them is dropped, as the whole ranking would drop it. Where the head is a large
    part of the row (a flat distribution) or the check fails, the whole row is ranked. Either
    way the sums are the same to the bit (the same probabilities, one softmax of the row,
    summed in the same order), so both keep the same tokens; tokens of equal probability may
    be ranked either way, as in any sort.
    """
    if logits.numel() == 0:
        return torch.ones_like(logits, dtype=torch.bool)
    probs, vocab = logits.softmax(-1), logits.shape[-1]
    head = _head_size(probs, top_p)
    # `torch.topk` of k ids: about 0.08 ms + 0.1 us an id, so up to a sixteenth of the row it
    # costs at most half what ranking the whole row does
    order = torch.topk(logits, head, dim=-1).indices if head <= vocab // 16 else None
    kept = None if order is None else _kept_in_order(probs.gather(-1, order), top_p)
    if kept is None or not bool((kept.cumulative >= top_p).all()):  # the whole row, ranked
        order = _ranking(logits)
        kept = _kept_in_order(probs.gather(-1, order), top_p)
    return torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, kept.keep)


def _ranking(logits: torch.Tensor) -> torch.Tensor:
    """Each row's ids, likeliest first (`[B, V]`, int64). numpy's argsort (sorting networks
    where the CPU has AVX2 or AVX-512) ranks 40,478 float32 logits in about 1.1 ms on one core,
    where `torch.sort` takes 3.3; other dtypes and devices take `torch.sort`."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.argsort(-logits.detach().numpy(), axis=-1))
    return torch.sort(logits, dim=-1, descending=True).indices


def _head_size(probs: torch.Tensor, top_p: float) -> int:
    """How many of each row's likeliest tokens hold at least `top_p` of its probability (the
    most over the rows), to within a factor of 2 in probability, in a few passes over the row
    and no sort: each probability's float32 exponent (its bits shifted: larger probabilities have
    larger exponents) counts it into one of 256 octaves, the octaves' masses summed from the
    top down show the first octave where the mass reaches `top_p`, and the head is every token
    from that octave up. An estimate only: `nucleus` checks the ranked head's sum itself."""
    rows, vocab = probs.shape
    if float(probs.amax(-1).min()) * (vocab // 16) < top_p:  # a sixteenth of the row falls short
        return vocab
    exponent = probs.float().view(torch.int32) >> 23  # probabilities are >= 0: no sign bit
    octave = (exponent + torch.arange(0, rows * 256, 256, dtype=torch.int32)[:, None]).flatten()
    mass = torch.bincount(octave, weights=probs.flatten(), minlength=rows * 256)
    reached = mass.view(rows, 256).flip(-1).cumsum(-1) >= top_p  # from the largest octave down
    # the first octave that reaches top_p (none, where rounding keeps the sum short: all)
    first = torch.where(reached.any(-1), 255 - reached.int().argmax(-1), 0)
    return max(1, int((exponent >= first[:, None]).sum(-1).max()))


class _Kept(NamedTuple):
    keep: torch.Tensor  # [B, k] bool, in the ranking's order
    cumulative: torch.Tensor  # [B] the ranked tokens' summed probability


def _kept_in_order(ranked: torch.Tensor, top_p: float) -> _Kept:
    """The nucleus rule over probabilities `ranked` `[B, k]`, likeliest first."""
    cum = ranked.cumsum(-1)
    keep = (cum - ranked) < top_p  # dropped where the tokens ranked above reach top_p
    keep[..., 0] = True
    return _Kept(keep, cum[..., -1])


def next_tokens(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> torch.Tensor:
    """The next token of each row: float logits `[B, V]` -> ids `[B, 1]` (argmax where
    `sampling` is greedy, else a draw from the filtered softmax with `generator`)."""
    if not sampling.greedy and (drawn := _kernel_draw(logits, sampling, generator)) is not None:
        return drawn
    logits = logits.contiguous()  # a no-op unless `choose` narrowed the rows to a vocabulary
    if sampling.greedy and (greedy := _greedy_op(logits)) is not None:
        ids, finite = greedy(logits)  # the ids below, and the check, in one call
        if not finite:
            raise Gpt1Error(NON_FINITE)
        return ids
    if not all_finite(logits):
        # Overflow (or damage): multinomial would crash, argmax would pick token 0.
        raise Gpt1Error(NON_FINITE)
    if sampling.greedy:
        # max's indices are argmax's (the first largest), from a kernel about 2.5x faster on CPU
        return logits.max(-1, keepdim=True).indices
    probs = filter_logits(logits, sampling).softmax(-1)
    return draw(probs, generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One id from each row of `probs` `[B, V]` (non-negative, finite, each row's sum > 0; it
    need not be 1): ids `[B, 1]`, drawn by inverting the row's cumulative sum at one uniform
    number from `generator`.

    `torch.multinomial(probs, 1)` draws the same distribution from one exponential number per
    id of the row (40,478 for GPT-1: about 0.9 ms a draw on one core, most of a sampled step's
    choice); this takes one number a row (about 0.07 ms). The sums are float64, so a token's
    share of [0, sum) is its probability to about 1e-16 of the row's sum; an id of probability
    0 is never drawn (its interval is empty).
    """
    cdf = probs.double().cumsum(-1)  # [B, V]
    total = cdf[:, -1:]
    u = torch.rand(probs.shape[0], 1, dtype=torch.float64, generator=generator, device=probs.device)
    ids = torch.searchsorted(cdf, u * total, right=True)  # the first id whose sum passes u
    if bool((ids >= probs.shape[-1]).any()):  # u * total rounded up to the sum itself
        positive = probs > 0
        if not bool(positive.any(-1).all()):
            raise ValueError("draw: a row of probabilities sums to 0")
        last = probs.shape[-1] - 1 - positive.flip(-1).int().argmax(-1, keepdim=True)
        ids = torch.where(ids >= probs.shape[-1], last, ids)
    return ids


NON_FINITE = "the model produced NaN or infinite logits; no sample is drawn from them"


# A temperature whose float32 is positive and finite: strictly between these (round to nearest).
_FP32_ZERO_UP_TO, _FP32_INF_FROM = 2.0**-150, 2.0**128 - 2.0**103


def _draw_op(logits: torch.Tensor, temperatures: list[float]):
    """gpt1's draw (`backend.draw_op`) where it takes these logits at these temperatures,
    else None (a temperature that is 0 or infinite in float32 goes through torch's operators,
    which handle it)."""
    if not (
        logits.dim() == 2
        and logits.is_cpu
        and logits.dtype in (torch.float32, torch.bfloat16)
        and logits.shape[-1] > 0
        and (logits.stride(-1) == 1 or logits.shape[-1] == 1)
        and all(_FP32_ZERO_UP_TO < t < _FP32_INF_FROM for t in temperatures)
    ):
        return None
    return backend.draw_op()


def draw_rows(
    logits: torch.Tensor,
    rows: list[int],
    samplings: list[Sampling],
    generators: list[torch.Generator | None],
    vocab: int | None = None,
) -> list[int] | None:
    """A token for each of `rows` of `logits` `[n, V]` (the ids below `vocab`), drawn with its
    sampling's options (not greedy: a temperature, top-k and top-p) and one uniform number from
    its generator, in one call of gpt1's kernel (`kernels/choice.cpp`); -1 for a row whose
    logits are not all finite. None where the kernel does not take these logits or options
    (`next_tokens` then draws with torch's operators).

    The distribution of `filter_logits`, softmax and `draw` (the options in transformers'
    order; the uniform number inverts the kept ids' cumulative sum, in float64, as `draw`
    does), in a few passes over each row, where torch's operators took 0.2-2 ms a row of
    GPT-1's 40,478 logits; a step's rows are split over the threads."""
    temperatures = [s.temperature for s in samplings]
    op = _draw_op(logits, temperatures)
    if op is None:
        return None
    if not rows:
        return []
    width = logits.shape[-1] if vocab is None else min(vocab, logits.shape[-1])
    uniforms = torch.cat([torch.rand(1, dtype=torch.float64, generator=g) for g in generators])
    ids = op(
        logits,
        torch.tensor(rows, dtype=torch.int64),
        torch.tensor(temperatures, dtype=torch.float64),
        torch.tensor([_top_k(s, width) for s in samplings], dtype=torch.int64),
        torch.tensor([1.0 if s.top_p is None else s.top_p for s in samplings], dtype=torch.float64),
        uniforms,
        width,
        True,
    )
    return ids.tolist()


def _top_k(sampling: Sampling, vocab: int) -> int:
    """`sampling`'s top-k as the kernel takes it: 0 where it keeps every id."""
    return 0 if sampling.top_k is None or sampling.top_k >= vocab else sampling.top_k


def _kernel_draw(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> torch.Tensor | None:
    """`next_tokens`'s draw on gpt1's kernel (`draw_rows`: every row with `sampling` and
    `generator`) where it takes these logits: ids `[B, 1]`, else None."""
    rows = logits.shape[0] if logits.dim() == 2 else 0
    ids = draw_rows(logits, list(range(rows)), [sampling] * rows, [generator] * rows)
    if ids is None:
        return None
    if min(ids, default=0) < 0:
        raise Gpt1Error(NON_FINITE)
    return torch.tensor(ids, dtype=torch.int64)[:, None]


def _greedy_op(logits: torch.Tensor):
    """gpt1's kernel for the greedy choice where it takes these logits, else None (its state
    is read by attributes only: decoding asks once a token)."""
    if (
        logits.dim() == 2
        and logits.is_cpu
        and logits.dtype in (torch.float32, torch.bfloat16)
        and logits.is_contiguous()
        and logits.shape[-1] > 0
    ):
        return backend.greedy_op()
    return None


def choose(
    logits: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None,
    vocab: int | None = None,
) -> torch.Tensor:
    """`next_tokens` with `sampling`'s options, among the ids below `vocab` when given.

    `vocab` is the tokenizer's size where the ids become text: a model may have more rows than
    its tokenizer has ids (a table padded to a round size, a test's random model), and an id
    past the tokenizer's would be drawn and then not decodable. A model with fewer rows (a
    pretrained one, without the 3 task tokens) is unaffected.
    """
    if vocab is not None and vocab < logits.shape[-1]:
        logits = logits[:, :vocab]  # [B, vocab]: the same ids, the rest not drawn (a view)
    return next_tokens(logits, sampling, generator)


def all_finite(x: torch.Tensor) -> bool:
    """`torch.isfinite(x).all()` in one pass and no temporaries (about 4x faster on a row of
    40k logits): a NaN anywhere makes both extremes NaN, and an infinity is an extreme."""
    lo, hi = torch.aminmax(x)
    return math.isfinite(lo.item()) and math.isfinite(hi.item())


def generate(
    model: torch.nn.Module,
    ids: torch.Tensor,
    max_new_tokens: int,
    *,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    **options: Any,
) -> torch.Tensor:
    """Continue `ids` `[B, T]` by `max_new_tokens` tokens; returns `[B, T + max_new_tokens]`.

    The one convenience that takes the sampling options as keywords: `options` are the other
    fields of `Sampling`, by name (`temperature=0` is greedy, `top_k=`, `top_p=`, `seed=`; any
    field `Sampling` gains is taken as it is), made into one `Sampling` for `sample_ids`.
    `model` is a `GPT` (incremental decoding with a key/value cache) or an `LSTMLM` (the LSTM
    baseline: it re-reads the last n_positions tokens each step, like GPT past its context).
    """
    sampling = Sampling(max_new_tokens=max_new_tokens, **options)
    return sample_ids(model, ids, sampling, generator, use_cache)


@torch.no_grad()
def sample_ids(
    model: torch.nn.Module,
    ids: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """`ids` `[B, T]` and their continuation, drawn with `sampling`: `[B, T + max_new_tokens]`.
    The model is put in eval mode for the call and restored."""
    if ids.dim() == 1:
        ids = ids[None]
    steps = list(generate_stream(model, ids, sampling, generator, use_cache))
    return torch.cat([ids.to(model.wte.weight.device), *steps], dim=1)


def generate_stream(
    model: torch.nn.Module,
    ids: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    window: int | None = None,
    vocab: int | None = None,
    speculator: Speculating | None = None,
) -> Iterator[torch.Tensor]:
    """`sample_ids`, one step at a time: yields each new token `[B, 1]` as soon as it is chosen.
    The model reads at most `window` tokens (default and at most its `n_positions`); only ids
    below `vocab` (the tokenizer's size, when the ids become text) are drawn (`choose`). A
    `speculator` (`gpt1.inference.speculative.Speculator`; one sequence only) verifies tokens
    drafted from the text several at a time, while it fits the window.

    The draws use `generator`; without one, a generator seeded with `sampling.seed` when it has
    one (`Sampling.generator`), torch's global one otherwise. The prompt is checked before the
    first token; the model is in eval mode while the generator runs and restored when it ends
    (or is closed early).
    """
    if ids.dim() == 1:
        ids = ids[None]
    check_prompt(model, ids)
    if generator is None and sampling.seed is not None:
        generator = sampling.generator(model.wte.weight.device)
    n_pos = model.config.n_positions
    n_pos = min(window or n_pos, n_pos)
    return _steps(model, ids, sampling, generator, use_cache, n_pos, vocab, speculator)


class Speculating(Protocol):
    """What the decoding loop asks of a speculator (`gpt1.inference.speculative.Speculator`,
    a module above this one: it chooses tokens with `choose`)."""

    def step(
        self,
        model: torch.nn.Module,
        cache: KVCache,
        last: torch.Tensor,
        sampling: Sampling,
        generator: torch.Generator | None,
        room: int,
        vocab: int | None,
    ) -> list[int] | None: ...

    def push(self, token: torch.Tensor) -> None: ...


def check_prompt(model: torch.nn.Module, ids: torch.Tensor) -> None:
    """A prompt `[B, T]` has at least one token, all in the model's vocabulary."""
    if ids.shape[-1] == 0:
        raise ConfigError("empty prompt: GPT-1 has no start-of-text token; give at least one token")
    vocab = model.config.vocab_size
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise ConfigError(f"prompt ids must be in [0, {vocab}), got {ids.min()}..{ids.max()}")


def _steps(
    model: torch.nn.Module,
    ids: torch.Tensor,
    sampling: Sampling,
    generator: torch.Generator | None,
    use_cache: bool,
    n_pos: int,
    vocab: int | None,
    speculator: Speculating | None,
) -> Iterator[torch.Tensor]:
    """The decoding loop behind `generate_stream` (a generator, so the checks above run eagerly),
    reading at most `n_pos` tokens; with a `speculator`, a step may yield several tokens."""
    was_training = model.training
    model.eval()
    device = model.wte.weight.device
    out = ids.to(device)
    cache = None
    if use_cache and isinstance(model, GPT):
        prepare_to_decode(model, sampling.max_new_tokens * out.shape[0])
        # Stored as a server's generations are (int8: int8 rows where the compiled step reads them).
        cache = KVCache(model.config.n_layer, n_pos, int8_step.cache_dtype(model))
    if out.shape[0] != 1 or cache is None:
        speculator = None  # drafts are verified for one sequence with a cache
    fresh = out[:, -n_pos:]  # the tokens the next forward pass has not seen yet
    chosen: list[torch.Tensor] = []  # tokens not yet joined to `out` (only a re-read needs it)
    left = sampling.max_new_tokens
    try:
        while left > 0:
            drafted = None
            if speculator is not None and cache is not None and fresh.shape[1] == 1:
                room = min(left, n_pos - len(cache)) - 1  # drafts that fit both limits
                drafted = speculator.step(model, cache, fresh, sampling, generator, room, vocab)
            if drafted is None:
                with torch.no_grad():
                    if cache is not None and len(cache) + fresh.shape[1] <= n_pos:
                        hidden = forward_cached(model, fresh, cache, last_only=True)[:, -1]
                    else:
                        cache = None  # past the context: positions shift, re-read the window
                        out, chosen = torch.cat([out, *chosen], dim=1), []
                        hidden = model(out[:, -n_pos:])[:, -1]
                    logits = model.lm_logits(hidden).float()  # [B, V]
                new = [choose(logits, sampling, generator, vocab)]
                if speculator is not None:
                    speculator.push(new[0])
            else:
                new = [torch.tensor([[t]], device=device) for t in drafted]
            for nxt in new:
                chosen.append(nxt)
                left -= 1
                yield nxt
            fresh = new[-1]
    finally:
        model.train(was_training)


class TextStream:
    """Incremental decoding: push token ids, get the text they add; joined with `flush()`, equal
    to `Tokenizer.decode` of all of them.

    A piece's `</w>` reads as a space unless the piece is the last one, where it is dropped: so
    a piece's text up to its first `</w>` is released at once, the rest when the next id comes
    (or, at `flush`, without its `</w>`).
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.pending = ""  # the last piece from its first `</w>` on

    def push(self, token: int) -> str:
        from gpt1.text.tokenizer import EOW

        (piece,) = self.tokenizer.pieces([token])
        cut = piece.find(EOW)
        cut = len(piece) if cut < 0 else cut
        text = self.pending.replace(EOW, " ") + piece[:cut]
        self.pending = piece[cut:]
        return text

    def flush(self) -> str:
        """The end of the text: what is held back, read as the last piece."""
        from gpt1.text.tokenizer import EOW

        text, self.pending = self.pending.replace(EOW, ""), ""
        return text
