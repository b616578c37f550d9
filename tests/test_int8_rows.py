"""Many-row int8 products with one activation scale per row, and the integer decoding step."""

import contextlib
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from gpt1 import GPT, ModelConfig
from gpt1.inference import backend, block_step, int8_rows, int8_step
from gpt1.inference import generate as generate_module
from gpt1.inference.batched import BatchedDecoder
from gpt1.inference.decoding import INT8_ROW_EXTRA, SlotPool, decode, forward_cached, prefill
from gpt1.inference.prepared import for_inference
from gpt1.inference.quantize import Int8Linear, quantize_int8_
from gpt1.inference.sampling import Sampling


@pytest.fixture(autouse=True)
def int8_kernel_on(monkeypatch):
    """The int8 kernels themselves (oneDNN's where it sums exactly, gpt1's own where it is
    built), whether or not the backend's timed checks would take them on this CPU."""
    monkeypatch.setenv("GPT1_INT8_MATMUL", "1")
    if backend.int8_many_rows() is None and not backend.few_rows_int8():
        pytest.skip("no exact int8 kernel here (oneDNN's missing or saturating, gpt1's not built)")


def _layer(k: int, n: int) -> Int8Linear:
    torch.manual_seed(0)
    linear = nn.Linear(k, n).to(torch.bfloat16)
    return Int8Linear(linear, torch.bfloat16)


@pytest.mark.parametrize("encoding", ["s8", "u8"])
@pytest.mark.parametrize(
    ("rows", "k", "n"),
    [(4, 64, 96), (12, 64, 96), (33, 256, 40), (9, 768, 300), (70, 128, 100), (64, 192, 16)],
)
def test_per_row_product_equals_its_plain_torch_arithmetic(rows, k, n, encoding, monkeypatch):
    """The int32 sums, converted and scaled, give the bits `reference` computes with exact
    integer sums: oneDNN's with either encoding of the activations, and gpt1's own kernel for the
    rows it takes (AVX2 up to 16, VNNI up to 64 as timed, AMX tiles up to 64 a pass)."""
    if rows > backend.own_int8_rows(k) and not backend.onednn_int8_exact(encoding):
        pytest.skip("oneDNN's int8 kernel saturates here (its sums are not the exact ones)")
    monkeypatch.setattr(backend, "int8_many_rows", lambda: encoding)
    layer = _layer(k, n)
    x = (torch.randn(rows, k) * torch.logspace(-2, 2, rows)[:, None]).to(torch.bfloat16)
    with torch.no_grad(), int8_rows.per_row():
        got = layer(x)
    form = backend.own_int8_form() if rows <= backend.own_int8_rows(k) else "s8"
    want = int8_rows.reference(x, layer.qweight, layer.scale, layer.bias, form)
    assert torch.equal(got, want)


@pytest.mark.parametrize("k", [96, 128])
def test_gpt1s_kernel_gives_the_exact_sums_at_any_row_count(k):
    """`rows_product` (AMX tiles of 16 rows, four a pass, where K is a multiple of 64 and the CPU
    has them; VNNI or AVX2 otherwise) gives `reference`'s bits at every row count, partial tiles
    and more than one pass included."""
    if not backend.few_rows_int8():
        pytest.skip("gpt1's int8 kernel is not built for this CPU")
    kernels = backend.kernel_module()
    layer = _layer(k, 40)
    packed = kernels.pack_vnni(layer.qweight)
    for rows in (1, 5, 16, 17, 64, 70, 130):
        x = torch.randn(rows, k) * torch.logspace(-2, 2, rows)[:, None]
        got = kernels.rows_product(x, packed, layer.scale, layer.bias.float(), 40)
        want = int8_rows.reference(
            x, layer.qweight, layer.scale, layer.bias.float(), backend.own_int8_form()
        )
        assert torch.equal(got, want), rows


@settings(max_examples=25, deadline=None, derandomize=True)
@given(rows=st.integers(1, 140), quads=st.integers(1, 900), n=st.integers(1, 40))
def test_gpt1s_kernel_gives_the_exact_sums_for_any_rows_and_width(rows, quads, n):
    """Any row count (VNNI: groups of up to 16 rows over each block of weights, slices of rows
    past a step's, the inputs in spans where groups share a block) and any width a multiple of
    4 give `reference`'s bits."""
    if not backend.few_rows_int8():
        pytest.skip("gpt1's int8 kernel is not built for this CPU")
    kernels = backend.kernel_module()
    k = 4 * quads
    layer = _layer(k, n)
    g = torch.Generator().manual_seed(rows * 1000 + quads)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-2, 2, rows)[:, None]
    got = kernels.rows_product(x, kernels.pack_vnni(layer.qweight), layer.scale, None, n)
    want = int8_rows.reference(x, layer.qweight, layer.scale, None, backend.own_int8_form())
    assert torch.equal(got, want)


@contextlib.contextmanager
def _vnni_rows_limit(rows: int):
    """The VNNI kernel's row limit set to `rows` for the block, then put back."""
    kernels = backend.kernel_module()
    before = kernels.vnni_rows_limit(rows)
    try:
        yield kernels
    finally:
        kernels.vnni_rows_limit(before)


def _vnni_choice_here() -> bool:
    return backend.few_rows_int8() and backend.kernel_module().vnni_rows_limit() > 0


@pytest.mark.parametrize("limit", [16, 40, 64])
def test_the_vnni_row_limit_moves_rows_between_kernels_with_the_same_bits(limit):
    """However many rows the VNNI kernel takes before oneDNN's, a product of 17 to 64 rows
    gives `reference`'s bits, and `own_int8_rows` reports the limit set."""
    if not _vnni_choice_here() or backend.int8_many_rows() is None:
        pytest.skip("no choice between gpt1's VNNI kernel and oneDNN's here (AMX, AVX2)")
    layer = _layer(768, 200)
    with _vnni_rows_limit(limit), torch.no_grad(), int8_rows.per_row():
        assert backend.own_int8_rows(768) == limit
        for rows in (17, 33, 64):
            x = torch.randn(rows, 768).to(torch.bfloat16)
            want = int8_rows.reference(x, layer.qweight, layer.scale, layer.bias)
            assert torch.equal(layer(x), want), rows


@pytest.mark.parametrize("rows", [0, -1, 8, 15, 65, 1000])
def test_the_vnni_row_limit_refuses_counts_outside_its_range(rows):
    """Only 16..64 can be set (0 asks); anything else is refused and changes nothing."""
    if not _vnni_choice_here():
        pytest.skip("no choice between gpt1's VNNI kernel and oneDNN's here (AMX, AVX2)")
    kernels = backend.kernel_module()
    before = kernels.vnni_rows_limit()
    if rows == 0:
        assert kernels.vnni_rows_limit(rows) == before
    else:
        with pytest.raises(RuntimeError, match="between 16 and 64"):
            kernels.vnni_rows_limit(rows)
    assert kernels.vnni_rows_limit() == before


_TIMES = st.floats(1e-6, 1.0)


_DAMAGED = st.one_of(
    st.none(), st.text(max_size=3), st.lists(_TIMES, max_size=3), st.lists(st.text(), max_size=2)
)


@given(
    st.dictionaries(
        st.sampled_from(["32", "64", "48", "x", "-1"]),
        st.one_of(st.tuples(_TIMES, _TIMES).map(list), _DAMAGED),
        max_size=4,
    )
)
def test_the_vnni_limit_is_the_most_rows_up_to_which_gpt1s_kernel_was_never_slower(times):
    """`VnniRowsProbe.limit`, on any record, damaged ones too: 16, 32 or 64; every count timed
    up to it holds two numbers and found gpt1's kernel not slower, and the next count timed
    either is missing or damaged or found it slower."""
    probe = backend.VnniRowsProbe(times)
    limit = probe.limit()
    assert limit in (16, 32, 64)
    counts = [32, 64]

    def not_slower(rows: int) -> bool:
        pair = probe.pair(rows)
        return pair is not None and pair[0] <= pair[1]

    assert all(not_slower(r) for r in counts if r <= limit)
    later = [r for r in counts if r > limit]
    assert not later or not not_slower(later[0])


def test_the_vnni_limit_is_set_as_its_timing_found(monkeypatch):
    """On first use the module takes the limit its record found (here: gpt1's kernel slower at
    64 rows, not at 32: 32)."""
    if not _vnni_choice_here() or backend.int8_many_rows() is None:
        pytest.skip("no choice between gpt1's VNNI kernel and oneDNN's here (AMX, AVX2)")
    probe = backend.VnniRowsProbe({"32": [1.0, 2.0], "64": [3.0, 2.0]})
    with _vnni_rows_limit(64) as kernels:
        monkeypatch.setattr(backend.timings, "kept", lambda name, kind, measure, again=False: probe)
        monkeypatch.setattr(backend, "_vnni_rows_set", set())  # the module not yet set
        assert backend.few_rows_int8()
        assert kernels.vnni_rows_limit() == 32
        assert backend.own_int8_rows(768) == 32


_ROW_KINDS = ["mixed", "positive", "negative", "zero", "constant", "tiny", "subnormal", "wide"]


def _rows_of_kinds(kinds: list[str], k: int, seed: int) -> torch.Tensor:
    """One row per kind: signs balanced or all one way, all zero, constant, tiny, subnormal
    or huge."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for kind in kinds:
        row = torch.randn(k, generator=g)
        row = {
            "positive": row.abs(),
            "negative": -row.abs(),
            "zero": torch.zeros(k),
            "constant": torch.full((k,), float(row[0])),
            "tiny": row * 1e-30,
            "subnormal": row * 1e-44,  # a scale of largest / 127 underflows to 0
            "wide": row * 1e30,
        }.get(kind, row)
        rows.append(row)
    return torch.stack(rows)


# A few rows of any width, each of a kind `_rows_of_kinds` makes: what the quantisers take.
_FEW_ROWS_OF_KINDS = dict(
    kinds=st.lists(st.sampled_from(_ROW_KINDS), min_size=1, max_size=8),
    k=st.integers(1, 300),
    seed=st.integers(0, 2**31 - 1),
)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    kinds=st.lists(st.sampled_from(_ROW_KINDS), min_size=1, max_size=40),
    quads=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_gpt1s_kernel_gives_the_reference_bits_for_rows_of_any_sign_and_range(kinds, quads, seed):
    """Rows of one sign, of both, all zero, constant, or near fp32's ends: the compiled kernel's
    quantisation and zero-point correction give `reference`'s bits in the kernel's own form."""
    if not backend.few_rows_int8():
        pytest.skip("gpt1's int8 kernel is not built for this CPU")
    kernels = backend.kernel_module()
    k = 4 * quads
    layer = _layer(k, 24)
    x = _rows_of_kinds(kinds, k, seed)
    got = kernels.rows_product(x, kernels.pack_vnni(layer.qweight), layer.scale, None, 24)
    want = int8_rows.reference(x, layer.qweight, layer.scale, None, backend.own_int8_form())
    assert torch.equal(got, want)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(**_FEW_ROWS_OF_KINDS)
def test_u7_rows_round_within_half_a_step_and_keep_s8s_step_for_one_sign(kinds, k, seed):
    """The AVX2 form: 128 levels per row, each value within half a step of its integer, the
    step the row's range [min(x, 0), max(x, 0)] over 127: the 8-bit form's step where the row
    holds one sign, twice it at most where signs balance. Neither form touches its input."""
    x = _rows_of_kinds(kinds, k, seed)
    before = x.clone()
    qx, scale = int8_rows.quantize_u7(x)
    q8, scale8 = int8_rows.quantize(x)
    assert torch.equal(x, before)  # fp32 rows are the caller's: quantised from a copy
    ints = qx.int()
    assert ((ints.amax(1) - ints.amin(1)) <= 127).all()
    error = (ints.double() * scale.double() - x.double()).abs()
    assert (error <= scale.double() * (0.5 + 1e-3)).all()
    one_sign = (x >= 0).all(1) | (x <= 0).all(1)
    assert torch.equal(scale[one_sign], scale8[one_sign])
    assert (scale <= 2 * scale8 * (1 + 1e-6)).all()


@settings(max_examples=30, deadline=None, derandomize=True)
@given(**_FEW_ROWS_OF_KINDS)
def test_the_compiled_s8_quantiser_gives_torchs_integers_and_scales(kinds, k, seed):
    """The two passes of `kernels/int8_rows.cpp` and the plain-torch form agree bit for bit on
    rows of any sign and range, subnormal ones (scale 1, all 0) included."""
    kernels = backend.int8_row_kernels()
    if kernels is None:
        pytest.skip("the compiled quantiser is not built for this CPU")
    x = _rows_of_kinds(kinds, k, seed)
    got, want = int8_rows.quantize(x, kernels), int8_rows.quantize(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_rows_result_does_not_depend_on_its_neighbours():
    """One scale per row: row 0 gives the same bits beside small or huge neighbours. One scale
    per tensor (the other mode) does not: a huge neighbour coarsens row 0's integers."""
    layer = _layer(128, 64)
    torch.manual_seed(1)
    x = torch.randn(16, 128).to(torch.bfloat16)
    loud = x.clone()
    loud[1:] *= 100
    with torch.no_grad():
        with int8_rows.per_row():
            assert torch.equal(layer(x)[0], layer(loud)[0])
        if backend.int8_many_rows() is not None and not backend.int8_per_row():
            assert not torch.equal(layer(x)[0], layer(loud)[0])  # oneDNN's, one scale a tensor


def test_non_finite_rows_take_the_float_path():
    layer = _layer(64, 32)
    x = torch.randn(10, 64).to(torch.bfloat16)
    x[3, 5] = float("inf")
    with torch.no_grad(), int8_rows.per_row():
        out = layer(x)
    assert torch.isinf(out[3]).any() or torch.isnan(out[3]).any()
    assert torch.isfinite(out[0]).all()


def test_the_threshold_holds_from_where_the_integer_step_wins_on():
    probe = int8_step.StepProbe(
        rows=[12, 16, 32, 64],
        one_call=[[1.0, 1.0], [1.0, 1.0], [2.0, 1.0], [4.0, 1.0]],
        integer=[[0.9, 5.0], [0.9, 1.2], [1.0, 1.5], [1.5, 2.0]],
    )
    assert probe.threshold(1) == 32  # 16 loses on one block, 32 and 64 win
    assert probe.threshold(12) == 16  # twelve blocks outweigh the head from 16 on
    assert probe.threshold(0) is None  # the output layer alone: never
    never = int8_step.StepProbe([12, 64], [[1.0, 1.0]] * 2, [[0.9, 1.0], [2.0, 1.0]])
    assert never.threshold(12) is None  # loses at the largest count: nowhere


def test_integer_step_rows_are_independent_of_the_other_sequences():
    """A sequence's hidden state from the integer step is the same bits whichever sequences
    share the step, and close to the one-call step's."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = for_inference(GPT(config), "cpu", "int8")
    pool = SlotPool(2, 64)
    gen = torch.Generator().manual_seed(2)
    caches = [pool.cache() for _ in range(24)]
    with torch.no_grad():
        for cache in caches:
            forward_cached(model, torch.randint(0, 300, (1, 5), generator=gen), cache)
        ids = torch.randint(0, 300, (24,), generator=gen)
        results = []
        for rows in (list(range(12)), [0, *range(12, 24)]):
            picked = [caches[r] for r in rows]
            with int8_rows.per_row():
                results.append(decode(model, ids[rows], picked, one_call=False))
            for cache in picked:
                cache.truncate(5)
            grouped = decode(model, ids[rows], picked)
            for cache in picked:
                cache.truncate(5)
            torch.testing.assert_close(results[-1].float(), grouped.float(), atol=0.1, rtol=0.05)
    assert torch.equal(results[0][0], results[1][0])


@pytest.mark.parametrize("activations", [torch.float32, torch.bfloat16])
def test_the_int8_models_caches_hold_int8_in_the_server_and_alone(activations, monkeypatch):
    """The int8 model's caches store keys and values as int8 rows with a scale and a bias
    (`decoding.quantize_cache_rows`) whatever its activations, a float model's in its own dtype:
    `BatchedDecoder`'s pool (`gpt1 serve`) while a generation runs, and the cache of `generate`
    (`gpt1 sample`), whose greedy tokens are the decoder's; without the compiled step, the
    activations' dtype."""
    if backend.decode_step_op() is None:
        pytest.skip("the compiled decoding step is not here: caches keep the activations' dtype")
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    floats = GPT(config).eval().to(activations)
    assert int8_step.cache_dtype(floats) is None
    model = quantize_int8_(GPT(config).eval().to(activations), activations)
    assert int8_step.cache_dtype(model) == torch.int8
    decoder = BatchedDecoder(model, speculate="off")
    assert decoder.pool.dtype == torch.int8
    gen = decoder.add([1, 2, 3], Sampling(max_new_tokens=3, temperature=0))
    tokens = []
    with torch.no_grad():
        while decoder.active:
            tokens += [t for g, t in decoder.step() if g is gen and t is not None]
            if decoder.active:  # the buffers live while a generation does
                assert [buffer.dtype for buffer in decoder.pool.k] == [torch.int8] * 2
                assert decoder.pool.k[0].shape[-1] == 16 + INT8_ROW_EXTRA  # a head's 16, then 8
    assert len(tokens) == 3
    made, original = [], generate_module.KVCache

    def recorded(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(generate_module, "KVCache", recorded)
    alone = generate_module.generate(model, torch.tensor([[1, 2, 3]]), 3, temperature=0)
    assert alone[0, 3:].tolist() == tokens
    assert [layer.k.dtype for layer in made[0].layers] == [torch.int8] * 2
    monkeypatch.setattr(backend, "decode_step_op", lambda: None)  # torch's operators decode:
    assert int8_step.cache_dtype(model) is None  # they would widen every cached number a layer


def _int8_model_with_caches(n: int, seed: int = 0):
    """The int8 model and n sequences of 3 to 8 tokens in a pool as `BatchedDecoder` makes
    it (int8 keys and values: `int8_step.cache_dtype`)."""
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = for_inference(GPT(config), "cpu", "int8")
    pool = SlotPool(2, 64, int8_step.cache_dtype(model))
    gen = torch.Generator().manual_seed(seed + 1)
    caches = [pool.cache() for _ in range(n)]
    with torch.no_grad():
        for cache in caches:
            length = int(torch.randint(3, 9, (1,), generator=gen))
            forward_cached(model, torch.randint(0, 300, (1, length), generator=gen), cache)
    return model, caches, torch.randint(0, 300, (n,), generator=gen)


@pytest.mark.parametrize("rows", [2, 9, 20])
def test_the_compiled_integer_step_computes_what_the_modules_compute(rows, monkeypatch):
    """The integer step in one call (`kernels/int8_rows.cpp` between C++ LayerNorm, attention
    and GELU) gives the modules' per-row step's hidden states, two steps running (the second
    reads the cache entries the first wrote), up to the summation order (bf16 activations:
    within two bf16 steps of the largest value)."""
    if backend.decode_step_op() is None:
        pytest.skip("gpt1's kernel is not built for this CPU")
    model, caches, ids = _int8_model_with_caches(rows)
    lengths = [len(c) for c in caches]

    def two_steps() -> list[torch.Tensor]:
        with torch.no_grad(), int8_rows.per_row():
            out = [decode(model, ids, caches, one_call=False) for _ in range(2)]
        assert all(len(c) == n + 2 for c, n in zip(caches, lengths))
        for cache, n in zip(caches, lengths):
            cache.truncate(n)
        return out

    fused = two_steps()
    monkeypatch.setattr(block_step, "integer_weights", lambda model: None)
    modules = two_steps()
    for mine, theirs in zip(fused, modules):
        step = 2 * 2.0**-7 * float(theirs.float().abs().max())
        assert float((mine.float() - theirs.float()).abs().max()) <= step


def test_the_integer_step_runs_when_first_used_under_inference_mode(monkeypatch):
    """Copies packed under `torch.inference_mode` are inference tensors, which keep no write
    counter: the step's record of them must not ask for one (it did, and every generation of
    a step ended in a RuntimeError)."""
    if backend.decode_step_op() is None:
        pytest.skip("gpt1's kernel is not built for this CPU")
    monkeypatch.setattr(int8_step, "integer", lambda model, rows: rows >= 2)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = for_inference(GPT(config), "cpu", "int8")
    with torch.inference_mode():
        decoder = BatchedDecoder(model, speculate="off")
        for prompt in ([5, 6, 7], [8, 9], [10, 11, 12, 13]):
            decoder.add(prompt, Sampling(max_new_tokens=4, temperature=0.0))
        events = [e for _ in range(5) for e in decoder.step()]
    failures = [e for _, e in events if isinstance(e, Exception)]
    assert not failures, failures[0]
    assert sum(isinstance(e, int) for _, e in events) == 12


def test_prompts_read_together_give_what_each_gives_alone():
    """`prefill`: several prompts through the model at once give each prompt's last hidden state
    and cache as `forward_cached` on it alone does (fp32: up to summation order), and a
    `BatchedDecoder` taking several prompts in one step chooses the lone runs' greedy tokens."""
    torch.manual_seed(3)
    config = ModelConfig(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = GPT(config).eval()
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 300, (1, t), generator=gen) for t in (5, 1, 9, 3)]
    pool = SlotPool(2, 64)
    with torch.no_grad():
        alone = [pool.cache() for _ in prompts]
        want = torch.cat([forward_cached(model, p, c)[:, -1] for p, c in zip(prompts, alone)])
        together = [pool.cache() for _ in prompts]
        got = prefill(model, prompts, together)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert [len(c) for c in together] == [len(c) for c in alone]
        nxt = torch.tensor([7, 8, 9, 10])  # the caches written: the next step reads them alike
        torch.testing.assert_close(
            decode(model, nxt, together), decode(model, nxt, alone), atol=1e-5, rtol=1e-5
        )
    greedy = Sampling(max_new_tokens=6, temperature=0.0)
    decoder = BatchedDecoder(model)
    started = [decoder.add(p[0].tolist(), greedy) for p in prompts]
    while decoder.active:
        decoder.step()
    for p, gen_ in zip(prompts, started):
        lone = BatchedDecoder(model)
        one = lone.add(p[0].tolist(), greedy)
        while lone.active:
            lone.step()
        assert gen_.ids.tolist() == one.ids.tolist()


_SATURATING = """
import torch
from torch import nn
from gpt1.inference import backend, int8_rows, quantize
from gpt1.inference.quantize import Int8Linear

torch.manual_seed(0)
layer = Int8Linear(nn.Linear(256, 96).to(torch.bfloat16), torch.bfloat16)
few = (torch.randn(12, 256) * torch.logspace(-2, 2, 12)[:, None]).to(torch.bfloat16)
# more rows than the AVX2 kernel takes in one slice (512 at K = 256)
many = (torch.randn(600, 256) * torch.logspace(-2, 2, 600)[:, None]).to(torch.bfloat16)
with torch.no_grad():
    got_few, got_many = layer(few), layer(many)
own = backend.few_rows_int8()
if own:
    form = backend.own_int8_form()
    exact = lambda x, q, s, b: int8_rows.reference(x, q, s, b, form)  # noqa: E731
else:
    exact = quantize._dequantised_linear
print(
    backend.onednn_int8_exact("u8"),
    own,
    torch.equal(got_few, exact(few, layer.qweight, layer.scale, layer.bias)),
    torch.equal(got_many, exact(many, layer.qweight, layer.scale, layer.bias)),
)
"""


def test_int8_products_stay_exact_where_onednn_saturates():
    """oneDNN's int8 kernel without VNNI (capped at AVX2 here) sums with `vpmaddubsw`, whose
    16-bit pairs saturate: the check sees it, and int8 products then never take it. They go to
    gpt1's own kernel at every row count, whose sums are exact (the plain-torch reference's
    bits, one scale per row), or to the float product where that kernel is not built."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "GPT1_INT8_MATMUL": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _SATURATING], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    exact, _, few_equal, many_equal = done.stdout.split()[-4:]
    assert exact == "False" and few_equal == "True" and many_equal == "True"
