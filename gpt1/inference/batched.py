"""Continuous batching: many independent generations advanced together, a token each per step.

Decoding one sequence reads every weight once per token, so batch-1 decoding is bound by memory
bandwidth and n concurrent sequences decoded one by one cost n reads of the weights per token.
`BatchedDecoder` runs the prompts of the sequences that join in one step through the model
together (`prefill`: each fills its own key/value cache; a lone prompt runs as
`generate_stream` runs it), then advances every sequence that is past its prompt in one `decode` call and
one output-layer product: the weights are read once per step for all of them. Their keys and
values share one `SlotPool` (`gpt1.inference.decoding`), so each layer's attention over all of them,
of different lengths, is one call too. Sequences join and leave between steps.

Tokens are chosen exactly as `gpt1 sample` chooses them (`gpt1.inference.generate.choose`, with
each sequence's own `Sampling` and random generator), so a sequence decoded alone gives
`generate_stream`'s tokens bit for bit. Decoded with others, its logits can differ from a lone
run's in the last float digits (a matrix product over more rows may sum in another order).
A generation decoded alone may take several tokens in a step: it verifies tokens drafted from its
own text (`gpt1.inference.speculative`; by default for greedy ones, whose tokens stay the same),
counted in `BatchedDecoder.drafts`; several generations share each step without drafts.
Models without a key/value cache (the LSTM baseline) and sequences past the model's context take
`generate_stream`'s other path: the last `window` tokens (default `n_positions`; the server
passes the window the model was trained on) re-read each step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gpt1.errors import Gpt1Error
from gpt1.inference import int8_rows, int8_step
from gpt1.inference.decoding import (
    KVCache,
    SlotPool,
    decode,
    forward_cached,
    prefill,
    prepare_to_decode,
)
from gpt1.inference.generate import (
    NON_FINITE,
    check_prompt,
    choose,
    draw_rows,
)
from gpt1.inference.sampling import Sampling
from gpt1.inference.speculative import Drafts, Speculator
from gpt1.model.gpt import GPT


@dataclass(eq=False)
class Generation:
    """One sequence being generated: its tokens so far and what it still needs."""

    prompt: torch.Tensor  # [1, P]
    remaining: int  # new tokens still to choose
    sampling: Sampling
    generator: torch.Generator | None
    cache: KVCache | None  # None: no cache (LSTM), or past the context
    fresh: torch.Tensor  # [1, t] the tokens the model has not seen yet
    speculator: Speculator | None = None  # drafts tokens while it is the only generation
    # The tokens chosen so far, in order: a list a step appends to, where a tensor grown by
    # concatenation cost each of 64 generations a copy and an allocation every step.
    chosen: list[int] = field(default_factory=list)

    @property
    def ids(self) -> torch.Tensor:
        """`[1, T]`: the prompt and the tokens chosen so far."""
        if not self.chosen:
            return self.prompt
        new = torch.tensor([self.chosen], dtype=self.prompt.dtype, device=self.prompt.device)
        return torch.cat([self.prompt, new], dim=1)


Event = tuple[Generation, "int | None | Exception"]  # a token, None (finished) or its error


class BatchedDecoder:
    """The generations of one model (see the module docstring). Not thread-safe: one thread
    calls `add`, `step` and `stop` (the server's batching worker)."""

    def __init__(
        self,
        model: torch.nn.Module,
        window: int | None = None,
        vocab: int | None = None,
        speculate: str = "auto",
    ):
        """`window`: the most tokens a step reads; `vocab`: draw only ids below it (the
        tokenizer's size, when the ids become text: `choose`); `speculate`: when a generation
        decoded alone verifies tokens drafted from its text (`gpt1.inference.speculative.wanted`:
        by default when greedy), its drafts counted in `drafts`."""
        self.vocab, self.speculate, self.drafts = vocab, speculate, Drafts()
        self.model = model.eval()
        prepare_to_decode(model)  # now, not in the first request's time
        n_pos = model.config.n_positions
        self.n_positions = min(window or n_pos, n_pos)  # the most tokens a step reads
        self.device = model.wte.weight.device
        self.active: list[Generation] = []
        self.pool = SlotPool(model.config.n_layer, self.n_positions, int8_step.cache_dtype(model))

    def add(
        self,
        prompt: list[int] | torch.Tensor,
        sampling: Sampling,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """Add a generation drawn with `sampling` (`generator`: as `generate_stream`'s); the
        prompt is checked here, as `generate_stream` checks it, and the tokens come from the
        following `step()`s."""
        ids = torch.as_tensor(prompt, dtype=torch.long).reshape(1, -1)
        check_prompt(self.model, ids)
        if generator is None and sampling.seed is not None:
            generator = sampling.generator(self.device)
        ids = ids.to(self.device)
        gen = Generation(
            ids,
            sampling.max_new_tokens,
            sampling,
            generator,
            self.pool.cache() if isinstance(self.model, GPT) else None,
            ids[:, -self.n_positions :],
        )
        if gen.cache is not None:
            # Its positions: the prompt's and each new token's but the last (never read back).
            self.pool.expect(gen.fresh.shape[1] + sampling.max_new_tokens - 1)
            gen.speculator = Speculator.wanted(
                self.speculate, sampling, ids[0].tolist(), self.drafts
            )
        self.active.append(gen)
        return gen

    def stop(self, gen: Generation) -> None:
        """Drop a generation (its client left): its cache is freed."""
        if gen in self.active:
            self.active.remove(gen)
        self._drop_cache(gen)

    def step(self) -> list[Event]:
        """One token for every active generation; a generation's last token is followed by
        its `None` in the same list, and a failing one gets its exception (the others go on)."""
        events: list[Event] = []
        for gen in [g for g in self.active if g.remaining <= 0]:  # asked for no tokens
            self._finish(gen, None, events)
        together: list[Generation] = []
        alone: list[Generation] = []
        for gen in self.active:
            (together if self._joins_batch(gen) else alone).append(gen)
        with torch.no_grad():
            prompts = [g for g in alone if self._prefills(g)]
            if len(prompts) > 1:
                alone = [g for g in alone if g not in prompts]
                self._prefill(prompts, events)
            for gen in alone:
                try:
                    logits = self.model.lm_logits(self._hidden_alone(gen))  # [1, V]
                except Exception as exc:
                    self._finish(gen, exc, events)
                    continue
                self._choose(gen, logits, events)
            if len(together) == 1 and not alone and self._speculated(together[0], events):
                return events
            if together:
                try:
                    ids = torch.cat([g.fresh for g in together], dim=1)[0]  # [n]
                    with int8_step.step(self.model, len(together)) as one_call:
                        caches = [g.cache for g in together]
                        hidden = decode(self.model, ids, caches, one_call=one_call)  # [n, C]
                        logits = self.model.lm_logits(hidden)  # [n, V]
                except Exception as exc:
                    for gen in together:
                        self._finish(gen, exc, events)
                    return events
                self._choose_each(together, logits, events)
        return events

    # ------------------------------------------------------------------ internals
    def _prefills(self, gen: Generation) -> bool:
        """A prompt (several fresh tokens) that fits in its cache: read with the others."""
        cache, fresh = gen.cache, gen.fresh.shape[1]
        return cache is not None and fresh > 1 and len(cache) + fresh <= self.n_positions

    def _prefill(self, gens: list[Generation], events: list[Event]) -> None:
        """The prompts of several generations through the model at once (`prefill`: each
        weight read once for all their rows), and their first tokens."""
        try:
            hidden = prefill(self.model, [g.fresh for g in gens], [g.cache for g in gens])
            with int8_rows.per_row():  # each row its own activation scale, as in `prefill`
                logits = self.model.lm_logits(hidden)  # [n, V]
        except Exception as exc:
            for gen in gens:
                self._finish(gen, exc, events)
            return
        self._choose_each(gens, logits, events)

    def _joins_batch(self, gen: Generation) -> bool:
        """Past its prompt (one fresh token) with room left in its cache."""
        cache = gen.cache
        return (
            cache is not None
            and len(cache) > 0
            and gen.fresh.shape[1] == 1
            and len(cache) < self.n_positions
        )

    def _hidden_alone(self, gen: Generation) -> torch.Tensor:
        """The last position's hidden state `[1, C]`, as `generate_stream` computes it."""
        if gen.cache is not None and len(gen.cache) + gen.fresh.shape[1] <= self.n_positions:
            return forward_cached(self.model, gen.fresh, gen.cache, last_only=True)[:, -1]
        self._drop_cache(gen)  # past the context: positions shift, re-read the window each step
        return self.model(gen.ids[:, -self.n_positions :])[:, -1]

    @staticmethod
    def _drop_cache(gen: Generation) -> None:
        if gen.cache is not None:
            gen.cache.release()
            gen.cache = None

    def _speculated(self, gen: Generation, events: list[Event]) -> bool:
        """A lone generation's step with drafts (`Speculator.step`), where it drafts any."""
        if gen.speculator is None or gen.cache is None:
            return False
        room = min(gen.remaining, self.n_positions - len(gen.cache)) - 1  # within both limits
        try:
            tokens = gen.speculator.step(
                self.model, gen.cache, gen.fresh, gen.sampling, gen.generator, room, self.vocab
            )
        except Exception as exc:
            self._finish(gen, exc, events)
            return True
        if tokens is None:
            return False
        self._emit(gen, torch.tensor([tokens], device=self.device), events, tokens)
        return True

    def _choose_each(self, gens: list[Generation], logits: torch.Tensor, events: list[Event]):
        """The next token of each of `gens` from its row of `logits` `[n, V]`. Where all are
        greedy (a server's usual case) the choices are one call over every row, the tokens
        `choose` gives each row alone (greedy ignores the other sampling options), without a
        call's overhead for each. A row that is not finite sends each generation back to its
        own choice, so only the broken ones end, each with its own error."""
        if len(gens) > 1 and all(g.sampling.greedy for g in gens):
            try:
                ids = choose(logits, gens[0].sampling, None, self.vocab)  # [n, 1]
            except Gpt1Error:
                pass
            else:
                # The rows' tensors in one split and their ids in one list, not a slice and a
                # list per row.
                for gen, new, token in zip(gens, ids.split(1), ids[:, 0].tolist()):
                    self._take(gen, new, events, [token])
                return
        drawn = self._draw_together(gens, logits)
        for r, gen in enumerate(gens):
            if r not in drawn:
                self._choose(gen, logits[r : r + 1], events)
            elif drawn[r] < 0:
                self._finish(gen, Gpt1Error(NON_FINITE), events)
            else:
                self._take(gen, torch.tensor([[drawn[r]]], device=self.device), events, [drawn[r]])

    def _draw_together(self, gens: list[Generation], logits: torch.Tensor) -> dict[int, int]:
        """The tokens of the generations that draw (not greedy), by row: one call of gpt1's
        kernel for all of them (`draw_rows`, each row's own options and generator; -1 where a
        row is not finite), where it takes these logits and there are two or more. Each gets
        the token it would get alone."""
        rows = [r for r, g in enumerate(gens) if not g.sampling.greedy]
        if len(rows) < 2:
            return {}
        ids = draw_rows(
            logits,
            rows,
            [gens[r].sampling for r in rows],
            [gens[r].generator for r in rows],
            self.vocab,
        )
        return {} if ids is None else dict(zip(rows, ids))

    def _choose(self, gen: Generation, logits: torch.Tensor, events: list[Event]) -> None:
        """The next token of `gen` from its logits `[1, V]` in the model's dtype: a greedy
        choice reads them as they are (a bf16 number's fp32 copy is exact, so the argmax is the
        same), a draw widens its own row to fp32 (widening a whole step's logits would copy 2.6
        million numbers at 64 sequences, a few % of the step)."""
        if not gen.sampling.greedy:
            logits = logits.float()
        try:
            nxt = choose(logits, gen.sampling, gen.generator, self.vocab)
        except Exception as exc:
            self._finish(gen, exc, events)
            return
        self._take(gen, nxt, events)

    def _take(
        self,
        gen: Generation,
        nxt: torch.Tensor,
        events: list[Event],
        tokens: list[int] | None = None,
    ) -> None:
        """`gen`'s chosen token `[1, 1]` (`tokens`: as a list, where the caller has it)."""
        if gen.speculator is not None:
            gen.speculator.push(nxt)  # its drafts come from every token
        self._emit(gen, nxt, events, tokens)

    def _emit(
        self,
        gen: Generation,
        new: torch.Tensor,
        events: list[Event],
        tokens: list[int] | None = None,
    ) -> None:
        """New tokens `[1, t]` chosen for `gen`, in order (`tokens`: the same as a list)."""
        tokens = new[0].tolist() if tokens is None else tokens  # not a 0-d tensor per token
        gen.chosen.extend(tokens)
        gen.fresh = new if new.shape[1] == 1 else new[:, -1:]
        gen.remaining -= len(tokens)
        events.extend((gen, t) for t in tokens)
        if gen.remaining <= 0:
            self._finish(gen, None, events)

    def _finish(self, gen: Generation, end: Exception | None, events: list[Event]) -> None:
        self.stop(gen)
        events.append((gen, end))
