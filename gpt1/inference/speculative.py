"""Speculative decoding with drafts from the text itself (prompt lookup, as vLLM's `ngram`
speculator and llama.cpp's lookup decoding offer), for one sequence at a time.

Decoding one sequence reads every weight once per token. Where the text repeats itself (a passage
of the prompt continued or quoted, a list, code), the next tokens can be guessed: find the last
few tokens earlier in the text and propose the tokens that followed them there (`Drafter`). One
pass of the model then checks k guesses at once: the last chosen token and the k drafted ones go
through `forward_cached` as k + 1 new positions of the cache, giving the logits after each. Where
the one-call step applies (`gpt1.inference.block_step`) that is one call of it, each position a
row reading the weights with the others; else the blocks run as modules on all the rows. Drafts
are accepted while they are what decoding would choose, the cache is cut back to the positions
accepted, and the token after them is chosen from the same pass: every pass yields at least one
token.

- Greedy: a draft is accepted when it is the argmax. The tokens are plain decoding's: through the
  one-call step each row's logits are the bits plain decoding computes; through the modules, up
  to the summation order of the products (several rows may sum in another order than one; where
  two logits tie to the last digits, the choice may differ, as between batched and lone decoding).
- Sampled: the drafted token x (a point mass) is accepted with probability p(x), p the target
  distribution after temperature, top-k and top-p (`filter_logits`, as plain sampling); on a
  rejection the token is drawn from p with x removed and renormalised (max(p - q, 0) normalised,
  q the point mass). Every token is then distributed exactly as plain sampling's, but a seed
  draws other tokens than plain decoding with the same seed: so `auto` speculates for greedy
  decoding only, `on` for sampling too (`wanted`).

The draft length adapts (`Pace`): it doubles while drafts are accepted whole, falls to one more
than those accepted on a rejection, and where a pass does not pay (nothing accepted, or the pass
took longer than plain steps for the tokens it gave, timed as they run) drafting pauses for a
number of tokens that doubles with each such miss in a row: text that does not repeat, and small
models whose passes of several rows cost several steps, decode at about plain speed.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import torch

from gpt1.errors import ConfigError, Gpt1Error
from gpt1.inference import matvec
from gpt1.inference.decoding import KVCache, forward_cached
from gpt1.inference.generate import NON_FINITE, all_finite, choose, draw, filter_logits
from gpt1.inference.sampling import Sampling

MODES = ("auto", "on", "off")
MAX_DRAFT = matvec.MAX_ROWS - 1  # the last token and its drafts: one few-row product per layer
LONGEST_NGRAM = 3  # the longest run of tokens looked up (then shorter ones, down to one)
MAX_MISSES = 6  # a pause lasts at most 2**MAX_MISSES tokens
TIMED_PASSES = 4  # passes timed before a model's passes are judged unable to pay
HOPELESS_PAUSE = 512  # tokens without drafts where a model's passes cannot pay (then one more)


def wanted(speculate: str, sampling: Sampling) -> bool:
    """Whether `speculate` applies to `sampling`: "auto" for greedy decoding only (the tokens
    plain decoding chooses), "on" for sampling too (exact in distribution), "off" never."""
    if speculate not in MODES:
        raise ConfigError(f"speculate must be one of {', '.join(MODES)}; got {speculate!r}")
    return speculate == "on" or (speculate == "auto" and sampling.greedy)


@dataclass
class Drafts:
    """Drafted tokens and how many of them were accepted (of a generation, or of a server)."""

    drafted: int = 0
    accepted: int = 0

    def __str__(self) -> str:
        share = 100 * self.accepted / self.drafted if self.drafted else 0.0
        return f"drafts accepted: {self.accepted} of {self.drafted} ({share:.0f}%)"


class Drafter:
    """The tokens so far and, for every run of 1..`LONGEST_NGRAM` tokens, where it last ended
    with a token after it (updated as tokens come: a few dictionary writes each)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens: list[int] = []
        self.ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(LONGEST_NGRAM)]
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # the runs ending here now have a token after them
            self.tokens.append(token)
            for n in range(1, min(LONGEST_NGRAM, end) + 1):
                self.ends[n - 1][tuple(self.tokens[end - n : end])] = end

    def draft(self, k: int) -> list[int]:
        """k tokens that followed the longest run ending the text, where it last occurred
        before ([] where no run of the text's last tokens occurred before). Where that is
        fewer than k tokens before the end (the text is in a loop), the loop goes on."""
        if k <= 0:
            return []
        tokens = self.tokens
        for n in range(min(LONGEST_NGRAM, len(tokens)), 0, -1):
            end = self.ends[n - 1].get(tuple(tokens[-n:]))
            if end is not None:
                period = len(tokens) - end  # the text after `end` repeats every `period` tokens
                return [tokens[end + i % period] for i in range(k)]
        return []


class Costs:
    """One model's plain step and verifying pass times, as moving averages shared by all its
    generations (`costs_of`): a pass of k drafts that costs as much as k + 1 plain steps can
    never pay, whatever is accepted (a small model whose pass of several rows runs through the
    operators, at several one-call steps' cost; or whose products are bound by arithmetic)."""

    def __init__(self) -> None:
        self.step_seconds: float | None = None  # a plain step
        self.pass_share: float | None = None  # a pass over (its drafts + 1) plain steps
        self.passes = 0
        self.shapes: set[int] = set()  # draft lengths passed once (their first pass is not timed)

    def hopeless(self) -> bool:
        """Passes, timed at least `TIMED_PASSES` times, cost more than their tokens at best."""
        return self.passes >= TIMED_PASSES and self.pass_share is not None and self.pass_share >= 1

    def plain_step(self, seconds: float) -> None:
        self.step_seconds = _average(self.step_seconds, seconds)

    def verified(self, drafted: int, seconds: float) -> bool:
        """A pass of `drafted` drafts took `seconds`; False where that says nothing (the first
        pass of k + 1 rows also prepares kernels and buffers for that shape)."""
        if drafted not in self.shapes:
            self.shapes.add(drafted)
            return False
        if self.step_seconds is not None:
            share = seconds / ((drafted + 1) * self.step_seconds)
            self.pass_share = _average(self.pass_share, share)
            self.passes += 1
        return True


def _average(mean: float | None, seconds: float) -> float:
    """A moving average of times (or shares), a sample counting at most 3 times the mean (a
    step the system paused for says nothing of the step)."""
    return seconds if mean is None else 0.8 * mean + 0.2 * min(seconds, 3 * mean)


_costs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> Costs


def costs_of(model: torch.nn.Module) -> Costs:
    """The `Costs` of `model` (made on first use, forgotten with the model)."""
    if model not in _costs:
        _costs[model] = Costs()
    return _costs[model]


class Pace:
    """The draft length and when to draft. The length doubles (up to `MAX_DRAFT`) while drafts
    are accepted whole and falls to one more than those accepted on a rejection. A pass that
    does not pay (nothing accepted, or passes take longer per token they give than plain steps,
    both as moving averages) pauses drafting for 2**misses tokens (misses: such passes in a
    row, less one per pass that paid, at most `MAX_MISSES`); where the model's passes cannot
    pay at all (`Costs.hopeless`), for `HOPELESS_PAUSE` tokens."""

    def __init__(self, costs: Costs | None = None) -> None:
        self.k, self.pause, self.misses = 2, 0, 0
        self.costs = costs if costs is not None else Costs()
        self.token_seconds: float | None = None  # a pass's time per token it gave (average)
        if self.costs.hopeless():
            self.pause = HOPELESS_PAUSE

    def length(self) -> int:
        """This token's draft length (0 while paused; each call is a token of the pause)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.k

    def update(self, drafted: int, accepted: int, seconds: float | None = None) -> None:
        """A pass verified `drafted` tokens in `seconds`, accepting the first `accepted`."""
        self.k = min(2 * self.k, MAX_DRAFT) if accepted == drafted else accepted + 1
        if seconds is not None and self.costs.verified(drafted, seconds):
            self.token_seconds = _average(self.token_seconds, seconds / (accepted + 1))
        plain, drafted_token = self.costs.step_seconds, self.token_seconds
        paid = plain is None or drafted_token is None or drafted_token < plain
        if accepted == 0 or not paid:
            self.misses = min(self.misses + 1, MAX_MISSES)
            self.pause = 2**self.misses
        else:
            self.misses = max(self.misses - 1, 0)
        if self.costs.hopeless():
            self.pause = HOPELESS_PAUSE


def accept(
    logits: torch.Tensor,
    draft: list[int],
    sampling: Sampling,
    generator: torch.Generator | None,
    vocab: int | None = None,
) -> list[int]:
    """The drafts accepted and the token after them, from logits `[k + 1, V]` after the last
    chosen token and after each of the k drafts (the rules are the module docstring's), among
    the ids below `vocab` as `choose` draws them."""
    if sampling.greedy:
        best = choose(logits, sampling, None, vocab)[:, 0].tolist()  # argmax of each row
        a = 0
        while a < len(draft) and draft[a] == best[a]:
            a += 1
        return draft[:a] + [best[a]]
    if vocab is not None and vocab < logits.shape[-1]:
        logits = logits[:, :vocab]  # as `choose`: the ids past the tokenizer's are never drawn
    if not all_finite(logits):
        raise Gpt1Error(NON_FINITE)
    probs = filter_logits(logits, sampling).softmax(-1)  # [k + 1, V]
    for j, x in enumerate(draft):
        p = float(probs[j, x]) if x < probs.shape[-1] else 0.0
        if float(torch.rand((), generator=generator, device=probs.device)) < p:
            continue
        rest = probs[j].clone()
        if x < rest.shape[0]:
            rest[x] = 0  # p with x removed: `draw` renormalises
        return draft[:j] + [int(draw(rest[None], generator))]
    return draft + [int(draw(probs[-1:], generator))]


class Speculator:
    """One sequence's speculation: its drafter, its pace and the counts it adds to (`step` is
    what `gpt1.inference.generate.generate_stream` and `BatchedDecoder` call)."""

    def __init__(self, tokens: list[int], counts: Drafts | None = None) -> None:
        self.drafter = Drafter(tokens)
        self.pace: Pace | None = None  # made at the first step, with the model's `Costs`
        self.counts = counts if counts is not None else Drafts()
        self.plain_from: float | None = None  # when the caller began a plain step (`step`)
        self.pending: list[torch.Tensor] = []  # tokens pushed, not yet read by the drafter

    @classmethod
    def wanted(
        cls, speculate: str, sampling: Sampling, tokens: list[int], counts: Drafts | None = None
    ) -> Speculator | None:
        """A speculator for a sequence starting with `tokens`, where `speculate` applies to
        `sampling` (`wanted`); else None."""
        return cls(tokens, counts) if wanted(speculate, sampling) else None

    def push(self, token: torch.Tensor) -> None:
        """A token `[1, 1]` chosen without drafts (every token must reach the drafter); after a
        `step` that drafted nothing, the end of the plain step the caller took instead (timed).
        Tokens are read out of their tensors only when a draft is wanted (a few microseconds
        each: a small model's whole step takes a few hundred)."""
        if self.plain_from is not None and self.pace is not None:
            self.pace.costs.plain_step(time.perf_counter() - self.plain_from)
            self.plain_from = None
        self.pending.append(token)

    @torch.no_grad()
    def step(
        self,
        model: torch.nn.Module,
        cache: KVCache,
        last: torch.Tensor,
        sampling: Sampling,
        generator: torch.Generator | None,
        room: int,
        vocab: int | None = None,
    ) -> list[int] | None:
        """The tokens after `last` `[1, 1]` (the one token `cache` has not seen) from one pass with at
        most `room` drafts: those accepted and the one after them, `cache` holding `last` and
        the accepted drafts. None where nothing is drafted this token: take a plain step."""
        start = time.perf_counter()
        if self.pace is None:  # the model is known from the first step on
            self.pace = Pace(costs_of(model))
        k = min(self.pace.length(), room, MAX_DRAFT)
        if k > 0 and self.pending:
            self.drafter.extend(torch.cat(self.pending, dim=1)[0].tolist())
            self.pending = []
        draft = self.drafter.draft(k)
        if not draft:
            self.plain_from = time.perf_counter()
            return None
        self.plain_from = None
        past = len(cache)
        ids = torch.tensor([[int(last[0, 0]), *draft]], device=last.device)  # [1, k + 1]
        hidden = forward_cached(model, ids, cache)[0]  # [k + 1, C]
        tokens = accept(model.lm_logits(hidden).float(), draft, sampling, generator, vocab)
        cache.truncate(past + len(tokens))  # last and the accepted drafts
        self.counts.drafted += len(draft)
        self.counts.accepted += len(tokens) - 1
        self.pace.update(len(draft), len(tokens) - 1, time.perf_counter() - start)
        self.drafter.extend(tokens)
        return tokens
