"""The kernel's draw (`kernels/choice.cpp`, `generate.draw_rows`): each id is where the row's
exact cumulative distribution passes the uniform number, never an id of probability 0, the
same whichever rows share the call, and non-finite rows refused."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpt1.inference import backend
from gpt1.inference.generate import choose, draw_rows
from gpt1.inference.sampling import Sampling


def _op():
    op = backend.draw_op()
    if op is None:
        pytest.skip("the decoding kernel is not built (gpt1 kernels build) or cannot be here")
    return op


def _exact_cdf(row: list[float], temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The row's cumulative softmax at `temperature` over its top-k logits (every id tied with
    the k-th largest too; all where `top_k` is 0), then its top-p nucleus (ranked by weight, then
    by id; an id stays unless those above it hold `top_p`), in float64 (-inf: probability 0).
    Rows whose nucleus is cut within fp32's rounding of a weight, or between two weights that
    fp32 rounds alike (the kernel then ranks them by id), are left out (`assume`)."""
    x = np.array(row, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        z = (x - x.max()) / temperature
    w = np.where(np.isneginf(x), 0.0, np.exp(z))
    if 0 < top_k < len(row):
        w = np.where(x < np.sort(x)[::-1][top_k - 1], 0.0, w)
    if top_p < 1.0:
        order = np.lexsort((np.arange(len(w)), -w))
        before = np.concatenate([[0.0], np.cumsum(w[order])[:-1]]) / w.sum()
        assume(np.all(np.abs(before - top_p)[w[order] > 0] > 1e-4))
        drop = before >= top_p
        drop[0] = False
        kept, dropped = w[order[~drop]], w[order[drop]]
        assume(not dropped.size or dropped.max() < kept.min() * (1 - 1e-5))
        w[order[drop]] = 0.0
    return np.cumsum(w / w.sum())


LOGITS = st.one_of(
    st.floats(-30, 30, width=32),
    st.sampled_from([0.0, -0.0, 5.0, -100.0, 1e30, -1e30, 1e-40]),
)


@settings(max_examples=300, deadline=None)
@given(
    row=st.lists(LOGITS, min_size=1, max_size=300),
    filtered=st.lists(st.integers(0, 299), max_size=30),
    temperature=st.sampled_from([1e-3, 0.3, 1.0, 2.5, 1e3]),
    top_k=st.integers(0, 310),
    top_p=st.one_of(st.just(1.0), st.floats(0.01, 0.99)),
    u=st.floats(0.0, 1.0, exclude_max=True),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_the_kernels_draw_is_the_exact_inverse_of_the_cumulative_distribution(
    row, filtered, temperature, top_k, top_p, u, dtype
):
    """For any row (ties, spans wider than fp32's exponent at small temperatures, ids filtered
    out as -inf, fp32 or bf16), any top-k (0: none; past the row: none), top-p and u in [0, 1),
    the id drawn owns u in the float64 cumulative distribution of the row's softmax over its top
    k and then its nucleus, to fp32's rounding of each probability, and has a probability
    above 0."""
    op = _op()
    keep_finite = not filtered
    for i in filtered:
        if i < len(row) and sum(math.isinf(v) for v in row) < len(row) - 1:
            row[i] = -math.inf
    logits = torch.tensor([row], dtype=dtype)
    values = logits.float()[0].tolist()
    ids = op(
        logits,
        torch.tensor([0]),
        torch.tensor([temperature], dtype=torch.float64),
        torch.tensor([top_k]),
        torch.tensor([top_p], dtype=torch.float64),
        torch.tensor([u], dtype=torch.float64),
        len(row),
        keep_finite,
    )
    if keep_finite and any(math.isinf(v) for v in values):
        assert ids.tolist() == [-1]
        return
    cdf = _exact_cdf(values, temperature, top_k, top_p)
    (i,) = ids.tolist()
    below = cdf[i - 1] if i > 0 else 0.0
    assert cdf[i] > below  # a positive probability
    slack = 1e-5  # fp32 exponentials, relative error about 2e-7 each, summed
    assert below - slack <= u <= cdf[i] + slack


def test_non_finite_rows_are_refused_and_filtered_ids_never_drawn():
    op = _op()
    rows = torch.tensor(
        [
            [0.0, 1.0, math.nan, 2.0],
            [0.0, math.inf, 1.0, 2.0],
            [0.0, -math.inf, 1.0, 2.0],
            [-math.inf] * 4,
            [-math.inf, 3.0, -math.inf, -math.inf],
        ]
    )
    every, none = torch.arange(5), torch.zeros(5, dtype=torch.int64)
    ones = torch.ones(5, dtype=torch.float64)
    u = torch.full((5,), 0.999999, dtype=torch.float64)
    assert op(rows, every, ones, none, ones, u, 4, True).tolist() == [-1, -1, -1, -1, -1]
    assert op(rows, every, ones, none, ones, u, 4, False).tolist() == [-1, -1, 3, -1, 1]
    # the last id of positive probability where u * sum rounds up to the sum itself
    highest = torch.full((1,), 1.0 - 2.0**-53, dtype=torch.float64)
    row = torch.tensor([[1.0, 2.0, -math.inf, -math.inf]])
    assert op(row, torch.tensor([0]), ones[:1], none[:1], ones[:1], highest, 4, False).tolist() == [
        1
    ]
    # top-k 2 of [5, 1, 4, 4]: the k-th largest is 4, and both 4s stay
    row, two = torch.tensor([[5.0, 1.0, 4.0, 4.0]]), torch.tensor([2])
    assert op(row, torch.tensor([0]), ones[:1], two, ones[:1], highest, 4, True).tolist() == [3]
    zero = torch.zeros(1, dtype=torch.float64)
    assert op(row, torch.tensor([0]), ones[:1], two, ones[:1], zero, 4, True).tolist() == [0]
    # the smallest top-p keeps the likeliest id alone
    tiny = torch.full((1,), 1e-300, dtype=torch.float64)
    assert op(row, torch.tensor([0]), ones[:1], none[:1], tiny, highest, 4, True).tolist() == [0]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 40), vocab=st.integers(1, 700))
def test_a_rows_draw_does_not_depend_on_the_rows_beside_it(seed, n, vocab):
    """Rows drawn in one call (split over threads) get the ids each gets alone, within the
    vocabulary asked for, from a view whose rows are longer than it."""
    op = _op()
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab + 5, generator=generator) * 4
    temperatures = torch.rand(n, dtype=torch.float64, generator=generator) + 0.1
    top_ks = torch.randint(0, vocab + 2, (n,), generator=generator)
    top_ps = torch.rand(n, dtype=torch.float64, generator=generator).clamp(0.05, 1.0)
    u = torch.rand(n, dtype=torch.float64, generator=generator)
    together = op(logits, torch.arange(n), temperatures, top_ks, top_ps, u, vocab, True).tolist()
    alone = [
        op(
            logits[r : r + 1].clone(),
            torch.tensor([0]),
            temperatures[r : r + 1],
            top_ks[r : r + 1],
            top_ps[r : r + 1],
            u[r : r + 1],
            vocab,
            True,
        ).item()
        for r in range(n)
    ]
    assert together == alone and all(0 <= i < vocab for i in together)


def test_choose_draws_the_softmax_at_its_temperature():
    """Many draws of one row through `choose` (the kernel where it is built, torch's operators
    where not) match softmax(x / T) (chi-square, p > 0.001), and a generator's state gives
    the same ids again."""
    from scipy.stats import chisquare

    x = torch.tensor([[2.0, -1.0, 0.5, 1.5, -80.0, 0.0, 3.0]])  # id 4: about e^-119
    sampling = Sampling(temperature=0.7)
    p = torch.softmax(x / 0.7, -1)[0]

    def ids(seed):
        generator = torch.Generator().manual_seed(seed)
        return torch.cat([choose(x, sampling, generator) for _ in range(20_000)])[:, 0]

    got = ids(0)
    counts = torch.bincount(got, minlength=7)
    assert counts[4] == 0
    kept = p > 1e-9  # id 4 apart: an expected count of about 0 is no chi-square cell
    observed = counts[kept].double()
    expected = p[kept].double() / p[kept].double().sum() * observed.sum()
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 0.001
    assert torch.equal(got, ids(0))


def test_draw_rows_takes_each_rows_own_generator_and_options():
    _op()
    logits = torch.randn(3, 50)
    rows = [0, 2]
    samplings = [Sampling(temperature=0.5, top_p=0.5), Sampling(temperature=2.0, top_k=3)]

    def generators():
        return [torch.Generator().manual_seed(s) for s in (1, 2)]

    first = draw_rows(logits, rows, samplings, generators())
    again = [draw_rows(logits, [r], [s], [g])[0] for r, s, g in zip(rows, samplings, generators())]
    assert first == again
    assert first[1] in torch.topk(logits[2], 3).indices.tolist()
    # a vocabulary past the model's rows (a model without the task tokens) reads them all
    assert draw_rows(logits, rows, samplings, generators(), vocab=1000) == first
    tiny = Sampling(temperature=1e-50)  # 0 in fp32: torch's operators take it
    assert draw_rows(logits, rows, [samplings[0], tiny], [None, None]) is None
