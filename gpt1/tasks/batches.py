"""A task's split as model inputs: encoded examples, padded batches, the fine-tuning BatchSource.

Shared by fine-tuning (`FinetuneSource` feeds the training loop), evaluation and prediction
(`make_batch` over examples sorted by length) and the HTTP server (`encode_split`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt1.errors import ConfigError, DataError
from gpt1.tasks.examples import Split
from gpt1.tasks.registry import Task
from gpt1.tasks.transforms import SpecialIds, pad_batch, transform

log = logging.getLogger("gpt1.recipes.finetune")  # the name the run's messages always had


@dataclass
class Encoded:
    """A split turned into model inputs: K id sequences and a label per example."""

    items: list[list[list[int]]]
    labels: list[Any]
    uids: list[str]

    def digest(self) -> str:
        """sha256 of every example's id sequences and label, in order: what a fine-tuning
        checkpoint records of the examples its cursor indexes, so a resume on other examples
        (another or an edited training file, another tokenizer) is refused."""
        h = hashlib.sha256()
        for items, label in zip(self.items, self.labels):
            h.update(json.dumps([items, label]).encode())
            h.update(b"\n")
        return h.hexdigest()


def special_ids(tok: Any) -> SpecialIds:
    return SpecialIds(tok.start_id, tok.delimiter_id, tok.classify_id)


def encode_split(
    split: Split,
    task: Task,
    tok: Any,
    n_ctx: int,
    question_delimiter: bool = False,
    processes: int = 1,
) -> Encoded:
    """Every example of `split` through the task's transformation (texts encoded once each)."""
    texts: dict[str, None] = {}
    for e in split.examples:
        for t in (
            getattr(e, "text", None),
            getattr(e, "a", None),
            getattr(e, "b", None),
            getattr(e, "context", None),
            getattr(e, "question", None),
        ):
            if t is not None:
                texts[t] = None
        for c in getattr(e, "choices", []):
            texts[c] = None
    unique = list(texts)
    table = dict(zip(unique, tok.encode_batch(unique, processes)))
    ids = special_ids(tok)
    items = [
        transform(task.kind, e, table.__getitem__, ids, n_ctx, question_delimiter)
        for e in split.examples
    ]
    return Encoded(items, [e.label for e in split.examples], [e.uid for e in split.examples])


def example_length(item: list[list[int]]) -> int:
    """Padded length an example needs: its longest sequence (choices pad to the longest)."""
    return max((len(seq) for seq in item), default=0)


def make_batch(enc: Encoded, index: list[int], regression: bool) -> dict[str, torch.Tensor]:
    ids, mask = pad_batch([enc.items[i] for i in index])
    batch = {"ids": ids, "mask": mask}
    if all(enc.labels[i] is not None for i in index):
        dtype = torch.float32 if regression else torch.long
        batch["labels"] = torch.tensor([enc.labels[i] for i in index], dtype=dtype)
    return batch


# Length grouping sorts runs of this many micro-batches of a shuffled epoch by length.
GROUP_BATCHES = 50


class FinetuneSource:
    """Shuffled epochs over the training examples; rank r takes every world-th example.

    The permutation of epoch e comes from a generator seeded with (seed, e), so the state is
    just (epoch, position): resume continues with exactly the next example.

    With `group_by_length` (the micro-batch size; 0 = off) each epoch's shuffled order is cut
    into runs of `GROUP_BATCHES` micro-batches, each run sorted by length, the sorted runs cut
    into micro-batches and those shuffled again: batches hold examples of similar length, so
    far less padding (SST-2: 2.8x the real tokens with random batches of 32, 1.04x grouped),
    while every example is still seen once per epoch in a seeded order. OpenAI's code shuffled
    freely (and padded every example to the longest in the dataset), so this is off by default.
    """

    def __init__(
        self,
        enc: Encoded,
        seed: int,
        regression: bool,
        rank: int = 0,
        world: int = 1,
        group_by_length: int = 0,
        origin: str | Path | None = None,
    ):
        self.enc, self.seed, self.regression = enc, seed, regression
        self.origin = f" of {origin}" if origin else ""  # the training file, named in errors
        self._examples_digest: str | None = None
        self.rank, self.world = rank, world
        self.group = group_by_length
        self.epoch, self.pos = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1000003 + epoch)
        perm = torch.randperm(len(self.enc.items), generator=g).tolist()
        usable = len(perm) - len(perm) % self.world or len(perm)
        order = perm[:usable][self.rank :: self.world]
        return self._grouped(order, epoch, g) if self.group else order

    def _grouped(self, order: list[int], epoch: int, g: torch.Generator) -> list[int]:
        """`order` with runs sorted by length and cut where `next_batch` will cut them.

        Batches run on across epochs, so epoch e starts (e * len) % micro examples into a
        batch: its first `head` examples complete that batch, and whole micro-batches follow.
        """
        micro, n = self.group, len(order)
        head = (micro - epoch * n % micro) % micro
        run = GROUP_BATCHES * micro
        body = order[head:]
        body = [
            i
            for s in range(0, len(body), run)
            for i in sorted(body[s : s + run], key=lambda i: -example_length(self.enc.items[i]))
        ]
        whole = len(body) - len(body) % micro
        blocks = [body[s : s + micro] for s in range(0, whole, micro)]
        shuffled = [blocks[b] for b in torch.randperm(len(blocks), generator=g).tolist()]
        return order[:head] + [i for block in shuffled for i in block] + body[whole:]

    def next_batch(self, micro_batch_size: int) -> dict[str, torch.Tensor]:
        if self.group and micro_batch_size != self.group:
            raise ConfigError(
                f"this source groups by length for micro-batches of {self.group}, "
                f"asked for {micro_batch_size}"
            )
        index = []
        while len(index) < micro_batch_size:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            take = self._order[self.pos : self.pos + micro_batch_size - len(index)]
            index += take
            self.pos += len(take)
        return make_batch(self.enc, index, self.regression)

    def state_dict(self) -> dict:
        """The cursor (seed, epoch, position) and the digest of the examples it indexes."""
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed, "data": self._digest()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a `state_dict`; refused (DataError) where its examples were others (a
        state without a digest, from before gpt1 recorded one, is not checked)."""
        recorded = state.get("data")
        if recorded is not None and recorded != self._digest():
            raise DataError(
                f"the training examples{self.origin} are not those the run being resumed was "
                "trained on (their digests differ: the file was edited or replaced, or another "
                "tokenizer encodes it); resume with the run's data, or start a new run in "
                "another --out"
            )
        self.seed, self.epoch, self.pos = int(state["seed"]), int(state["epoch"]), int(state["pos"])
        self._order = self._permutation(self.epoch)

    def _digest(self) -> str:
        if self._examples_digest is None:  # once a process: a pass over every example's ids
            self._examples_digest = self.enc.digest()
        return self._examples_digest


def report_skipped(split: Split) -> None:
    if split.skipped:
        log.warning(
            "%s: skipped %d malformed rows (first: %s)",
            split.path,
            len(split.skipped),
            split.skipped[0],
        )
    if split.dropped:
        log.info("%s: left out %d rows without a gold label", split.path, split.dropped)
