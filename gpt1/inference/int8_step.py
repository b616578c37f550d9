"""How a decoding step of several concurrent sequences runs on an int8 model.

The one-call step (`gpt1.inference.block_step`) reads each int8 weight once for up to
`matvec.MAX_ROWS` rows, widens it to fp32 and multiplies in fp32; more rows go through it in
groups of that many. One row is bound by reading the weights; with more, every multiply-add is
a float one after a widening, and the step becomes bound by that arithmetic. The integer step
runs all the rows through the same one-call step at once, every weight product int8 x int8 with
int32 sums (gpt1's kernel for up to 16 rows on AVX2, 64 with AMX or VNNI, oneDNN's for more:
`kernels/int8_rows.cpp`, the arithmetic of `gpt1.inference.int8_rows`: one activation scale per
row, so a sequence's tokens do not depend on the others in the step), LayerNorm, attention and
GELU in C++ between them, and the output layer the same way; where the one-call step does not
apply, the blocks run as modules with the same products.

Which one runs for n rows is a timed check, kept per CPU and torch like `backend`'s
(`gpt1.inference.timings`: interleaved best-of rounds, recorded with the load): a one-block
GPT-1-size int8 model decodes one token for each of `ROWS` sequences of `PROMPT` cached
positions both ways, and the output layer runs on the same rows both ways; a model of L blocks
then takes the integer step from the smallest timed row count from which L blocks and the
output layer are not slower on it at every larger timed count (the largest count's choice holds
beyond it). Fewer rows, and every count where the integer step is slower at the largest, keep
the one-call step: no batch size gets slower. One row always does.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from gpt1.config import ModelConfig
from gpt1.inference import backend, block_step, int8_rows, timings
from gpt1.inference.decoding import SlotPool, decode, forward_cached
from gpt1.inference.prepared import for_inference
from gpt1.inference.quantize import Int8Linear
from gpt1.model.gpt import GPT

ROWS = (2, 4, 8, 12, 16, 24, 32, 48, 64)  # the row counts timed
RECORD = "int8_rows_step_6"  # the timings' record (named anew when either step changes)
PROMPT = 32  # cached positions of each timed sequence


@dataclass(frozen=True)
class StepProbe:
    """Seconds per row count (`rows`): `one_call[i]`/`integer[i]` = [one block's step, the
    output layer] with the one-call step (in groups) and with the integer step."""

    rows: list[int]
    one_call: list[list[float]]
    integer: list[list[float]]

    def threshold(self, n_layer: int) -> int | None:
        """The fewest rows from which the integer step is not slower for `n_layer` blocks at
        every larger timed count, or None (never)."""
        found = None
        for rows, old, new in reversed(list(zip(self.rows, self.one_call, self.integer))):
            if n_layer * new[0] + new[1] > n_layer * old[0] + old[1]:
                break
            found = rows
        return found


@functools.cache
def step_probe() -> StepProbe:
    """The check's times: the record's, else measured now (a few seconds) and recorded; a
    record of other row counts is timed again."""
    found = timings.kept(RECORD, StepProbe, _measure)
    return found if found.rows == list(ROWS) else probe_again()


def probe_again() -> StepProbe:
    """Time the check again now and record it (`gpt1 kernels probe`)."""
    found = timings.kept(RECORD, StepProbe, _measure, again=True)
    step_probe.cache_clear()
    return found


def integer(model: torch.nn.Module, rows: int) -> bool:
    """Whether a step of `rows` sequences of the int8 `model` takes the integer step."""
    if rows < 2 or (backend.int8_many_rows() is None and not backend.few_rows_int8()):
        return False  # one row: the step is bound by reading the weights, not by arithmetic
    if not isinstance(model, GPT) or not isinstance(model.h[0].mlp.c_fc, Int8Linear):
        return False  # not quantised (for_inference quantises every block's layers or none)
    x = torch.zeros(1, model.config.n_embd, dtype=model.wte.weight.dtype)
    if block_step.plan(model, x) is None:
        return False  # the blocks already run as modules: nothing to choose
    threshold = step_probe().threshold(model.config.n_layer)
    return threshold is not None and rows >= threshold


def cache_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """What the caches of the int8 `model`'s sequences (`BatchedDecoder`'s `SlotPool`,
    `generate_stream`'s `KVCache`) store keys and values in: int8, a scale and a bias per
    position and head (`decoding.quantize_cache_rows`), where the compiled step reads them;
    else None (the activations' own dtype: without the compiled step, torch's operators would
    widen a copy of every cached number at every layer).

    A step of many sequences reads every cached key and value at the memory's rate. int8 rows
    take D + 8 bytes where bf16 takes 2 D (0.56x at GPT-1's heads of 64), and moved a trained
    model's top token no more often than bf16 keys and values did (docs/commands/kernels.md,
    "Cached keys and values")."""
    if (
        isinstance(model, GPT)
        and isinstance(model.h[0].mlp.c_fc, Int8Linear)
        and backend.decode_step_op() is not None
    ):
        return torch.int8
    return None


@contextlib.contextmanager
def step(model: torch.nn.Module, rows: int) -> Iterator[bool]:
    """Around a step of `rows` sequences and its output layer: yields `decode`'s `one_call`
    (False for the integer step, whose products inside then take one scale per row)."""
    chosen = integer(model, rows)
    with int8_rows.per_row(chosen):
        yield not chosen


def _measure() -> StepProbe:
    """Time both steps on a one-block GPT-1-size int8 model of random weights, on one thread as
    `backend`'s checks do."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(0)
            model = for_inference(
                GPT(ModelConfig(n_layer=1, n_positions=PROMPT + 2)), "cpu", "int8"
            )
            found = [_time_rows(model, rows) for rows in ROWS]
    finally:
        torch.set_num_threads(threads)
    return StepProbe(list(ROWS), [f[0] for f in found], [f[1] for f in found])


def _time_rows(model: GPT, rows: int) -> tuple[list[float], list[float]]:
    pool = SlotPool(1, model.config.n_positions, cache_dtype(model))
    caches = [pool.cache() for _ in range(rows)]
    for cache in caches:
        forward_cached(model, torch.randint(0, 1000, (1, PROMPT)), cache)
    ids = torch.randint(0, 1000, (rows,))
    hidden = torch.randn(rows, model.config.n_embd).to(model.wte.weight.dtype)

    def stepping(one_call: bool) -> Callable[[], None]:
        def run() -> None:
            with int8_rows.per_row(not one_call):
                decode(model, ids, caches, one_call=one_call)
            for cache in caches:
                cache.truncate(PROMPT)

        return run

    def head(per_row: bool) -> Callable[[], None]:
        def run() -> None:
            with int8_rows.per_row(per_row):
                model.lm_logits(hidden)

        return run

    best = timings.interleaved_best(
        {
            "one_call": stepping(True),
            "integer": stepping(False),
            "one_call_head": head(False),
            "integer_head": head(True),
        }
    )
    for cache in caches:
        cache.release()
    return [best["one_call"], best["one_call_head"]], [best["integer"], best["integer_head"]]
