"""The paper's four input transformations (§3.3, Fig. 1) on token ids, padding and truncation.

Each example becomes K sequences of ids (K = 1 for classification and entailment, 2 for
similarity, one per answer for multiple choice):

- single:     [start] text [classify]
- pair:       [start] premise [delimiter] hypothesis [classify]
- similarity: [start] A [delimiter] B [classify]  and  [start] B [delimiter] A [classify]
- choice:     [start] context question [delimiter] answer_k [classify]   for each answer k
  (the paper's [z; q; $; a_k]: document and question concatenated. With
  `question_delimiter=True` a delimiter also separates them: [start] z [delimiter] q
  [delimiter] a_k [classify].)

Truncation policy (when a sequence would exceed `n_ctx`): the special tokens are never
removed, so the extract token is always the last real token. The content segments are cut
from their ends, longest first: tokens are taken off the currently longest segment until the
sequence fits (ties: the earlier segment). A short question or answer therefore survives a
long document intact, and both orders of a similarity pair are cut identically.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpt1.config import TaskKind
from gpt1.tasks.examples import ChoiceExample, Example, PairExample, TextExample


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the three task tokens (tokenizer vocab_size, +1, +2)."""

    start: int
    delimiter: int
    classify: int


def truncate(segments: list[list[int]], budget: int) -> list[list[int]]:
    """Cut `segments` from their ends, longest first, until their total length <= `budget`."""
    if budget < 0:
        raise ValueError(f"no room for content: budget {budget}")
    lengths = [len(s) for s in segments]
    excess = sum(lengths) - budget
    while excess > 0:
        longest = max(range(len(lengths)), key=lambda i: (lengths[i], -i))
        others = [n for i, n in enumerate(lengths) if i != longest]
        # Cut down to the next-longest segment at once (at least one token) to keep this O(K).
        step = max(1, min(excess, lengths[longest] - max(others, default=0)))
        lengths[longest] -= step
        excess -= step
    return [s[:n] for s, n in zip(segments, lengths)]


def _join(parts: list[list[int]], sep: int, ids: SpecialIds) -> list[int]:
    out = [ids.start]
    for i, part in enumerate(parts):
        if i:
            out.append(sep)
        out.extend(part)
    out.append(ids.classify)
    return out


def single(text: list[int], ids: SpecialIds, n_ctx: int) -> list[list[int]]:
    """Classification: one sequence."""
    (text,) = truncate([text], n_ctx - 2)
    return [_join([text], ids.delimiter, ids)]


def pair(a: list[int], b: list[int], ids: SpecialIds, n_ctx: int) -> list[list[int]]:
    """Entailment: premise, delimiter, hypothesis."""
    a, b = truncate([a, b], n_ctx - 3)
    return [_join([a, b], ids.delimiter, ids)]


def similarity(a: list[int], b: list[int], ids: SpecialIds, n_ctx: int) -> list[list[int]]:
    """Similarity: both orders, truncated identically."""
    a, b = truncate([a, b], n_ctx - 3)
    return [_join([a, b], ids.delimiter, ids), _join([b, a], ids.delimiter, ids)]


def choice(
    context: list[int],
    question: list[int],
    answers: list[list[int]],
    ids: SpecialIds,
    n_ctx: int,
    question_delimiter: bool = False,
) -> list[list[int]]:
    """Multiple choice: one sequence per answer."""
    out = []
    for answer in answers:
        if question_delimiter and question:
            c, q, a = truncate([context, question, answer], n_ctx - 4)
            out.append(_join([c, q, a], ids.delimiter, ids))
        else:
            c, q, a = truncate([context, question, answer], n_ctx - 3)
            out.append(_join([c + q, a], ids.delimiter, ids))
    return out


def transform(
    kind: str,
    example: Example,
    encode,
    ids: SpecialIds,
    n_ctx: int,
    question_delimiter: bool = False,
) -> list[list[int]]:
    """The K id sequences of `example` for a task of `kind`; `encode(text) -> list[int]`."""
    if kind == TaskKind.SINGLE:
        assert isinstance(example, TextExample)
        return single(encode(example.text), ids, n_ctx)
    if kind in (TaskKind.PAIR, TaskKind.SIMILARITY):
        assert isinstance(example, PairExample)
        fn = pair if kind == TaskKind.PAIR else similarity
        return fn(encode(example.a), encode(example.b), ids, n_ctx)
    if kind == TaskKind.CHOICE:
        assert isinstance(example, ChoiceExample)
        question = encode(example.question) if example.question.strip() else []
        return choice(
            encode(example.context),
            question,
            [encode(c) for c in example.choices],
            ids,
            n_ctx,
            question_delimiter,
        )
    raise ValueError(f"unknown task kind {kind!r}")


def pad_batch(items: list[list[list[int]]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad B examples of K sequences each -> ids `[B, K, T]` (int64), mask `[B, K, T]` (float).

    T is the longest sequence in the batch. Pads (id 0, `<unk>`, as OAI) sit after the extract
    token, so causal attention keeps them out of every state the heads and the LM loss read.
    """
    B, K = len(items), len(items[0])
    T = max(len(seq) for item in items for seq in item)
    ids = torch.full((B, K, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, K, T), dtype=torch.float32)
    for b, item in enumerate(items):
        if len(item) != K:
            raise ValueError(f"example {b} has {len(item)} sequences, expected {K}")
        for k, seq in enumerate(item):
            ids[b, k, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[b, k, : len(seq)] = 1.0
    return ids, mask
