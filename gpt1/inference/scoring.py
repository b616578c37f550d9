"""The batched, selective log-likelihood scorer behind the zero-shot heuristics, the lm-eval
adapter and the server's scores.

`Scorer` scores `(context ids, continuation ids)` requests. It runs the decoder once per batch of
right-padded rows and applies the tied output layer only at the positions whose next token is
scored (the last position for SST-2, the answer/continuation tokens for RACE, DPR, Story Cloze
and LAMBADA). Identical rows, and rows that are a prefix of another row, share one forward pass.
Rows are length-sorted and packed under a token budget, so padding stays small.

The heuristics that turn scores into task results live in `gpt1.zeroshot.heuristics`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpt1 import threads
from gpt1.errors import Gpt1Error
from gpt1.inplace import log_softmax_
from gpt1.train.chunked_ce import aligned_logits, logits_width


@dataclass
class Score:
    """Per-token log-probabilities of one continuation and, when asked for, whether every token
    was the argmax of its next-token distribution (None when not asked for)."""

    logprobs: list[float]
    greedy: bool | None
    # When asked for (`score(top=k)`): per scored token, the k likeliest tokens at its position
    # as (id, log-probability), likeliest first, taken from the same numbers as `logprobs`.
    top: list[list[tuple[int, float]]] | None = None

    @property
    def total(self) -> float:
        return float(sum(self.logprobs))

    @property
    def mean(self) -> float:
        return self.total / len(self.logprobs) if self.logprobs else float("-inf")


class Scorer:
    """Batched log-probability scoring of continuations with a `GPT` or `LSTMLM` (module doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        batch_tokens: int = 4096,
        max_rows: int = 64,
        logits_chunk: int = 1024,
        max_context: int | None = None,
    ):
        self.model = model.eval()
        # Rows never exceed the positions the model has (or, if smaller, was trained on).
        self.n_positions = min(model.config.n_positions, max_context or model.config.n_positions)
        self.batch_tokens, self.max_rows, self.logits_chunk = batch_tokens, max_rows, logits_chunk
        self.truncated = 0  # requests cut to fit n_positions (see `_plan`)
        self._logits_buffers: dict[torch.dtype, torch.Tensor] = {}  # reused [logits_chunk, V]

    def _plan(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]):
        """Rows to run (prefix-shared) and, per request, (row index, first position, targets)."""
        rows: dict[tuple[int, ...], int] = {}
        plans: list[tuple[tuple[int, ...], int, list[int]] | None] = []
        for ctx, cont in requests:
            ctx, cont = list(ctx), list(cont)
            if not cont:
                plans.append(None)
                continue
            if not ctx:
                raise ValueError("a continuation needs at least one context token to be scored")
            n_tokens = len(ctx) + len(cont)
            # A continuation longer than the context window keeps its first n_positions
            # tokens after one context token (the row is that token + all but the last
            # continuation token); a long context loses tokens on the left.
            cont = cont[: self.n_positions]
            room = self.n_positions - len(cont) + 1  # the row is ctx + cont[:-1]
            ctx = ctx[-room:]
            if len(ctx) + len(cont) < n_tokens:
                self.truncated += 1  # reported with the results
            key = tuple(ctx + cont[:-1])
            rows.setdefault(key, len(rows))
            plans.append((key, len(ctx) - 1, cont))
        # In lexicographic order a row that is a prefix of any other row is a prefix of its
        # successor, so one backward pass maps every row to the longest row that contains it.
        ordered = sorted(rows)
        canon: dict[tuple[int, ...], tuple[int, ...]] = {}
        for i in range(len(ordered) - 1, -1, -1):
            row = ordered[i]
            nxt = ordered[i + 1] if i + 1 < len(ordered) else None
            canon[row] = canon[nxt] if nxt is not None and nxt[: len(row)] == row else row
        return plans, canon

    @torch.inference_mode()
    def score(
        self,
        requests: Sequence[tuple[Sequence[int], Sequence[int]]],
        greedy: bool = False,
        top: int = 0,
    ) -> list[Score]:
        """One `Score` per request; an empty continuation gets an empty `Score`.

        `greedy` also checks each scored token against the argmax (one more pass over the logits);
        `top` > 0 also gives each scored position's `top` likeliest tokens (`Score.top`).
        """
        plans, canon = self._plan(requests)
        # Per canonical row: position -> the target tokens scored there (usually one).
        wanted: dict[tuple[int, ...], dict[int, set[int]]] = {}
        for plan in plans:
            if plan is not None:
                key, start, cont = plan
                positions = wanted.setdefault(canon[key], {})
                for offset, target in enumerate(cont):
                    positions.setdefault(start + offset, set()).add(target)
        results: dict[tuple[tuple[int, ...], int, int], tuple[float, bool]] = {}
        alternatives: dict[tuple[tuple[int, ...], int], list[tuple[int, float]]] = {}
        for batch in self._batches(sorted(wanted, key=len, reverse=True)):
            self._run(batch, wanted, results, greedy, (top, alternatives))
            threads.adapt()
        if any(lp != lp for lp, _ in results.values()):  # NaN: argmax would pick silently
            raise Gpt1Error(
                "the model produced NaN log-probabilities (overflow in this dtype, "
                "or damaged weights); scores would be meaningless"
            )
        out: list[Score] = []
        for plan in plans:
            if plan is None:
                out.append(Score([], True if greedy else None))
                continue
            key, start, cont = plan
            pairs = [results[(canon[key], start + i, t)] for i, t in enumerate(cont)]
            tops = (
                [alternatives[(canon[key], start + i)] for i in range(len(cont))] if top else None
            )
            out.append(
                Score([lp for lp, _ in pairs], all(g for _, g in pairs) if greedy else None, tops)
            )
        return out

    def _log_probs(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Log-softmax of the output layer at `hidden` `[n, C]` -> `[n, >= V]`, fp32 even in bf16.

        Columns past V (if any) hold -inf: index the result with token ids only.

        On CPU the logits land in reused buffers and the log-softmax overwrites them in place: a
        fresh `[n, V]` tensor (166 MB for 1,024 rows of GPT-1's vocabulary in fp32, 83 MB in
        bf16) costs a page fault per 4 KiB, and logsumexp's own temporary as much again. The
        fp32 buffer's rows are `logits_width` long (aligned: see `gpt1.train.chunked_ce`). 16-bit
        logits go through a 16-bit buffer, upcast once into the fp32 one. The result is a view of
        the fp32 buffer, valid until the next call.
        """
        if hidden.device.type != "cpu":
            return torch.log_softmax(F.linear(hidden, weight).float(), dim=-1)
        n, V = hidden.shape[0], weight.shape[0]
        out = self._buffer(torch.float32, n, logits_width(V, torch.float32))  # [n, width]
        if hidden.dtype == weight.dtype == torch.float32:
            aligned_logits(hidden, weight, out=out)
        else:  # 16-bit logits (their rows stay V long), upcast once into the fp32 rows
            low = (
                aligned_logits(hidden, weight, out=self._buffer(hidden.dtype, n, V))
                if hidden.dtype == weight.dtype
                else F.linear(hidden, weight)
            )  # [n, V]
            out[:, :V].copy_(low)
            out[:, V:] = -math.inf  # exp(-inf) = 0: the softmax ignores them
        return log_softmax_(out, 1)

    def _buffer(self, dtype: torch.dtype, n: int, width: int) -> torch.Tensor:
        """The first `n` rows of this scorer's reused `[>= n, width]` buffer of `dtype`."""
        buf = self._logits_buffers.get(dtype)
        if buf is None or buf.shape[1] != width or buf.shape[0] < n:
            buf = self._logits_buffers[dtype] = torch.empty(
                max(n, self.logits_chunk), width, dtype=dtype
            )
        return buf[:n]

    def _batches(self, rows: list[tuple[int, ...]]):
        batch: list[tuple[int, ...]] = []
        for row in rows:  # longest first, so the first row of a batch sets its width
            if batch and (
                (len(batch) + 1) * len(batch[0]) > self.batch_tokens or len(batch) >= self.max_rows
            ):
                yield batch
                batch = []
            batch.append(row)
        if batch:
            yield batch

    def _run(self, batch, wanted, results, greedy: bool, alternatives=(0, None)) -> None:
        device = self.model.wte.weight.device
        B, T = len(batch), len(batch[0])
        ids = torch.zeros(B, T, dtype=torch.long)  # right padding never reaches earlier positions
        for b, row in enumerate(batch):
            ids[b, : len(row)] = torch.tensor(row)
        # Rows are right-padded: the model skips the padding in its position-wise layers.
        lengths = torch.tensor([len(row) for row in batch], device=device)
        hidden = self.model(ids.to(device), lengths=lengths)  # [B, T, C]
        positions = [(b, pos) for b, row in enumerate(batch) for pos in sorted(wanted[batch[b]])]
        flat = torch.tensor([b * T + pos for b, pos in positions], device=device)
        picked = hidden.reshape(B * T, -1).index_select(0, flat)  # [N, C]
        weight = self.model.lm_weight()
        for lo in range(0, len(positions), self.logits_chunk):
            chunk = positions[lo : lo + self.logits_chunk]
            logp_all = self._log_probs(picked[lo : lo + len(chunk)], weight)  # [n, V] fp32
            triples = [(i, t) for i, (b, pos) in enumerate(chunk) for t in wanted[batch[b]][pos]]
            rows = torch.tensor([i for i, _ in triples], device=device)
            targets = torch.tensor([t for _, t in triples], device=device)
            # Only the scored entries leave the chunk.
            logp = logp_all[rows, targets].tolist()
            if greedy:  # the argmax of the log-probabilities is the argmax of the logits
                hit = (logp_all.argmax(dim=-1)[rows] == targets).tolist()
            else:
                hit = [None] * len(triples)
            for (i, t), lp, g in zip(triples, logp, hit):
                b, pos = chunk[i]
                results[(batch[b], pos, t)] = (lp, g)
            k, found = alternatives
            if k:
                values, ids = logp_all[:, : weight.shape[0]].topk(k, dim=-1)
                for (b, pos), row_ids, row_values in zip(chunk, ids.tolist(), values.tolist()):
                    found[(batch[b], pos)] = list(zip(row_ids, row_values))
