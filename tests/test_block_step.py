"""One decoding step through every block in one call (`gpt1.inference.block_step`, C++ in
`gpt1/inference/kernels/step.cpp`): it gives what the torch operators give, in every precision and
for every kind of cache, writes the caches as they do, and steps aside wherever it does not
apply (training, autograd, hooks, a refused model)."""

import contextlib
import warnings

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpt1 import GPT, ModelConfig
from gpt1.inference import backend, block_step
from gpt1.inference.decoding import (
    INT8_ROW_EXTRA,
    KVCache,
    SlotPool,
    cache_row_scales,
    decode,
    dequantize_cache_rows,
    forward_cached,
    quantize_cache_rows,
    quantize_cache_rows_reference,
    stored,
)
from gpt1.inference.prepack import prepack_for_inference
from gpt1.inference.quantize import quantize_int8_


@pytest.fixture(scope="module", autouse=True)
def kernel():
    backend.kernel()  # found built (tests never wait for a build: tests/conftest.py)
    if backend.decode_step_op() is None:
        pytest.skip(
            "the decoding step is not built (gpt1 kernels build), or built for AVX-512 or AVX2 CPUs "
            "only and this one runs the operators"
        )


def _model(precision: str, n_embd: int = 64, n_head: int = 4, afn: str = "gelu") -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=300, n_positions=80, n_embd=n_embd, n_layer=2, n_head=n_head, afn=afn
    )
    model = GPT(config).eval()
    if precision == "fp32":
        return prepack_for_inference(model)
    model = model.to(torch.bfloat16)
    return (
        quantize_int8_(model, torch.bfloat16)
        if precision == "int8"
        else prepack_for_inference(model)
    )


def _pooled_and_alone(
    model: GPT, prompts: list[torch.Tensor]
) -> tuple[SlotPool, list[KVCache], list[KVCache]]:
    """Each prompt in a slot of one pool and in a plain cache of its own, both filled."""
    pool = SlotPool(2, 80)
    pooled = [pool.cache() for _ in prompts]
    alone = [KVCache(2, 80) for _ in prompts]
    with torch.no_grad():
        for p, a, b in zip(prompts, pooled, alone):
            forward_cached(model, p, a)
            forward_cached(model, p, b)
    return pool, pooled, alone


@contextlib.contextmanager
def _operators_only(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(block_step, "plan", lambda model, x, integer=False: None)
        yield


def _close(got: torch.Tensor, want: torch.Tensor, precision: str) -> None:
    """fp32: the same up to summation order; bf16 activations: within two bf16 steps of the
    largest value (a sum rounded one way in one path and the other way in the other)."""
    got, want = got.float(), want.float()
    if precision == "fp32":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert (got - want).abs().max() <= 2 * 2**-7 * want.abs().max()


def _steps(model: GPT, prompt: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, KVCache]:
    """forward_cached over `prompt` [B, T], then one token at a time: the hidden states of the
    new tokens [B, n, C] and the cache."""
    cache = KVCache(model.config.n_layer, model.config.n_positions)
    with torch.no_grad():
        forward_cached(model, prompt, cache)
        hidden = [forward_cached(model, new[:, i : i + 1], cache) for i in range(new.shape[1])]
    return torch.cat(hidden, dim=1), cache


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize(
    ("n_embd", "n_head", "afn"),
    [(64, 4, "gelu"), (36, 4, "relu"), (272, 2, "gelu"), (128, 2, "gelu")],
)
def test_one_call_equals_the_operators_and_writes_the_same_cache(
    precision, n_embd, n_head, afn, monkeypatch
):
    """Two rows of one cache, 70 tokens after a prompt of 5: past the cache's first capacity
    (64), so its buffers grow between calls; a head size of 9 leaves lanes of every vector
    unused, one of 136 is read in more than one group of vectors (the kernel sums up to 8 at
    a time over the values), and one of 64 (GPT-1's) takes the loops compiled for that width.
    Hidden states and every cached key and value agree."""
    model = _model(precision, n_embd, n_head, afn)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 300, (2, 5), generator=gen)
    new = torch.randint(0, 300, (2, 70), generator=gen)
    x = torch.zeros(2, n_embd, dtype=model.wte.weight.dtype)
    with torch.no_grad():
        assert block_step.plan(model, x) is not None
    got, got_cache = _steps(model, prompt, new)
    with _operators_only(monkeypatch):
        want, want_cache = _steps(model, prompt, new)
    _close(got, want, precision)
    assert len(got_cache) == len(want_cache) == 75
    for mine, theirs in zip(got_cache.layers, want_cache.layers):
        _close(mine.k[:, :, :75], theirs.k[:, :, :75], precision)
        _close(mine.v[:, :, :75], theirs.v[:, :, :75], precision)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_many_sequences_of_a_pool_and_of_their_own_caches(precision, monkeypatch):
    """decode() for sequences of different lengths: slots of one pool (rows out of slot order,
    a hole left by a released slot) and plain caches of their own; each row equals that
    sequence decoded alone by the operators."""
    model = _model(precision)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 300, (1, n), generator=gen) for n in (7, 3, 12)]
    pool = SlotPool(2, 80)
    pooled = [pool.cache() for _ in range(4)]
    pooled.pop(1).release()  # slot 1 left empty
    own = [KVCache(2, 80) for _ in prompts]
    alone = [KVCache(2, 80) for _ in prompts]
    with torch.no_grad():
        for p, a, b, c in zip(prompts, pooled, own, alone):
            for cache in (a, b, c):
                forward_cached(model, p, cache)
        for step in range(6):
            ids = torch.randint(0, 300, (3,), generator=gen)
            order = [2, 0, 1] if step % 2 else [0, 1, 2]
            from_pool = decode(model, ids[order], [pooled[i] for i in order])
            from_own = decode(model, ids, own)
            with _operators_only(monkeypatch):
                want = [forward_cached(model, ids[i].view(1, 1), alone[i])[0, -1] for i in range(3)]
            for r, i in enumerate(order):
                _close(from_pool[r], want[i], precision)
                _close(from_own[i], want[i], precision)
    assert [len(c) for c in pooled] == [len(c) for c in alone] == [13, 9, 18]


@pytest.mark.parametrize(
    "precision, activations, cached",
    [
        ("fp32", torch.float32, torch.bfloat16),
        ("int8", torch.float32, torch.bfloat16),
        ("fp32", torch.float32, torch.int8),
        ("int8", torch.float32, torch.int8),
        ("int8", torch.bfloat16, torch.int8),
    ],
)
def test_a_pool_storing_narrower_keys_and_values(precision, activations, cached, monkeypatch):
    """A `SlotPool` whose buffers store keys and values narrower than the activations (the int8
    model's: `int8_step.cache_dtype`): bf16 under fp32 activations, or int8 rows with a scale
    and a bias (`decoding.quantize_cache_rows`). The one-call step writes the new keys and values as
    torch's path writes a prompt's, reads them widened as the operators do, and both give the
    same hidden states up to summation order, six steps of three sequences running (each step
    reads what the ones before wrote)."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=80, n_embd=64, n_layer=2, n_head=4)
    model = prepack_for_inference(GPT(config).eval().to(activations))
    if precision == "int8":
        model = quantize_int8_(model, activations)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (1, n), generator=gen) for n in (7, 3, 12)]
    pools = [SlotPool(2, 80, cached) for _ in range(2)]
    caches = [[pool.cache() for _ in prompts] for pool in pools]
    with torch.no_grad():
        for p, mine, theirs in zip(prompts, *caches):
            forward_cached(model, p, mine)
            forward_cached(model, p, theirs)
        for _ in range(6):
            ids = torch.randint(0, 300, (3,), generator=gen)
            x = torch.zeros(3, 64, dtype=activations)
            assert block_step.plan(model, x) is not None
            got = decode(model, ids, caches[0])
            with _operators_only(monkeypatch):
                want = decode(model, ids, caches[1])
            assert got.dtype == want.dtype == activations
            tolerance = 1e-4 if activations == torch.float32 else 3e-2
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    ends = [len(c) for c in caches[0]]
    assert ends == [len(c) for c in caches[1]] == [13, 9, 18]
    for mine, theirs in zip(pools[0].k + pools[0].v, pools[1].k + pools[1].v):
        assert mine.dtype == theirs.dtype == cached
        for slot, end in enumerate(ends):
            a = stored(mine[slot, :, :end], torch.float32)
            b = stored(theirs[slot, :, :end], torch.float32)
            if cached == torch.bfloat16:  # one bf16 step where a sum rounded the other way
                assert ((a - b).abs() <= 2**-7 * b.abs()).all()
            else:  # one int8 step of the row's, or a sum's difference
                step = cache_row_scales(theirs[slot, :, :end])[..., :1]
                assert ((a - b).abs() <= 1.01 * step + 1e-3).all()
    if cached == torch.int8:  # what a prompt wrote outside the step: the same bytes both ways
        prompt_rows = [(slot, len(p[0])) for slot, p in enumerate(prompts)]
        for mine, theirs in zip(pools[0].k + pools[0].v, pools[1].k + pools[1].v):
            for slot, length in prompt_rows:
                assert torch.equal(mine[slot, :, :length], theirs[slot, :, :length])


_ROW = st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=80)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    rows=st.lists(_ROW, min_size=1, max_size=4),
    bf16=st.booleans(),
    spoil=st.sampled_from([None, float("inf"), float("-inf"), float("nan")]),
)
@example(rows=[[0.5] * 64], bf16=False, spoil=None)  # one number: no spread, scale 0
@example(rows=[[0.0, 0.5, 1.5, 2.5, 255.0]], bf16=False, spoil=None)  # steps landing on ties
@example(rows=[[-3.0, 1e-30, 5e-39, 7.0]], bf16=True, spoil=None)  # tiny and subnormal numbers
@example(rows=[[0.0, 2.2168086563877393e-37]], bf16=False, spoil=None)  # 1 / scale overflows
def test_the_compiled_int8_cache_rows_are_the_reference_bytes(rows, bf16, spoil):
    """The compiled module's int8 cache rows (`quantize_cache_rows`, what the step writes) are
    the bytes `quantize_cache_rows_reference` gives, for rows of any width and spread, fp32 or
    bf16; read back, every number is within half a step of the row (its scale) of what was
    written, the row's smallest at -128 and its largest at 126 or 127 (255 steps on a grid
    holding 0, which reads back as 0); a row holding an inf or a NaN reads back as NaN, never
    as finite numbers."""
    width = len(rows[0])
    x = torch.tensor([(r * width)[:width] for r in rows], dtype=torch.float32)
    if bf16:
        x = x.to(torch.bfloat16)
    if spoil is not None:
        x[0, width // 2] = spoil
    got = quantize_cache_rows(x)
    want = quantize_cache_rows_reference(x)
    assert got.shape == want.shape == (len(rows), width + INT8_ROW_EXTRA)
    finite = torch.isfinite(x.float()).all(-1)
    assert torch.equal(got[finite], want[finite])
    back = dequantize_cache_rows(got, torch.float32)
    assert (
        back[~finite].isnan().all()
        and dequantize_cache_rows(want, torch.float32)[~finite].isnan().all()
    )
    scale = cache_row_scales(got)[..., :1]
    x, back, scale, q = x[finite].float(), back[finite], scale[finite], got[finite][..., :width]
    tiny = torch.finfo(torch.float32).tiny  # spreads below 255 of it: every number the smallest
    assert ((back - x).abs() <= scale * 0.5001 + 1e-6 * x.abs() + 256 * tiny).all()
    spread = scale[:, 0] >= tiny
    lowest = x.argmin(-1, keepdim=True)
    highest = x.argmax(-1, keepdim=True)
    assert (q.gather(-1, lowest)[spread] == -128).all()
    assert (q.gather(-1, highest)[spread] >= 126).all()
    assert (back[(x == 0) & spread[:, None]] == 0).all()  # the grid holds 0 itself


def test_it_steps_aside_for_training_autograd_and_hooks():
    model = _model("fp32")
    x = torch.zeros(1, 64)
    with torch.no_grad():
        assert block_step.plan(model, x) is not None
        model.train()
        assert block_step.plan(model, x) is None  # dropout
        model.eval()
        assert block_step.plan(model, torch.zeros(9, 64)) is None  # more than 8 rows
    assert block_step.plan(model, x) is None  # autograd on
    seen = []
    handle = model.h[1].mlp.c_fc.register_forward_hook(lambda *args: seen.append(1))
    cache = KVCache(2, 80)
    with torch.no_grad():
        assert block_step.plan(model, x) is None
        forward_cached(model, torch.tensor([[1, 2]]), cache)
        forward_cached(model, torch.tensor([[3]]), cache)
    assert len(seen) == 2  # the hook saw the prompt and the step
    handle.remove()
    with torch.no_grad():
        assert block_step.plan(model, x) is not None


def test_a_layer_swapped_after_a_step_is_seen():
    """Quantising a model that has decoded already: the next step reads the int8 weights."""
    model = _model("bf16")
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        before = block_step.plan(model, x)
        quantize_int8_(model, torch.bfloat16)
        after = block_step.plan(model, x)
    assert before is not None and after is not None and after is not before
    assert any(t.dtype == torch.int8 for t in after.tensors)
    assert not any(t.dtype == torch.int8 for t in before.tensors)


def test_a_refused_step_warns_once_and_the_operators_take_over(monkeypatch):
    model = _model("fp32")
    prompt, new = torch.tensor([[5, 6, 7]]), torch.tensor([[8, 9, 10]])
    with _operators_only(monkeypatch):
        want, want_cache = _steps(model, prompt, new)

    def refuse(*args):
        raise RuntimeError("decode_step: a cache must be [B, H, capacity, D]")

    with torch.no_grad():
        step = block_step.plan(model, torch.zeros(1, 64))
    monkeypatch.setattr(step, "op", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, cache = _steps(model, prompt, new)
    assert len([w for w in caught if "refused" in str(w.message)]) == 1
    torch.testing.assert_close(got, want)
    assert len(cache) == len(want_cache) == 6


def test_the_kernel_refuses_what_it_cannot_take():
    model = _model("fp32")
    with torch.no_grad():
        step = block_step.plan(model, torch.zeros(1, 64))
    buffers = torch.zeros(1, 4, 8, 16)
    good = dict(keys=[buffers] * 2, values=[buffers] * 2, rows=[0], lengths=[0])
    x = torch.zeros(1, 64)
    step.run(x, **good)  # accepted
    for bad, match in [
        (dict(good, lengths=[8]), "no room"),
        (dict(good, rows=[1]), "no room"),
        (dict(good, keys=[buffers.bfloat16()] * 2), "all of one dtype"),  # values fp32
        (
            dict(good, keys=[buffers.double()] * 2, values=[buffers.double()] * 2),
            "x's dtype, bf16 or int8",
        ),
        (dict(good, keys=[buffers]), "a cache per block"),
        (  # int8 rows without room for their scale and bias
            dict(good, keys=[buffers.to(torch.int8)] * 2, values=[buffers.to(torch.int8)] * 2),
            r"D \+ 8 bytes",
        ),
    ]:
        with pytest.raises(RuntimeError, match=match):
            step.run(x, **bad)
    bf16 = [buffers.bfloat16()] * 2
    step.run(x, **dict(good, keys=bf16, values=bf16))  # bf16 caches under fp32 activations
    int8 = [torch.zeros(1, 4, 8, 16 + INT8_ROW_EXTRA, dtype=torch.int8)] * 2
    step.run(x, **dict(good, keys=int8, values=int8))  # int8 rows, a scale and a bias each
    with torch.no_grad():
        bf16_step = block_step.plan(_model("bf16"), x.bfloat16())
    with pytest.raises(RuntimeError, match="x's dtype, bf16 or int8"):  # not fp32 under bf16
        bf16_step.run(x.bfloat16(), **good)
    with pytest.raises(RuntimeError, match="rows"):
        step.run(torch.zeros(9, 64), [buffers] * 18, [buffers] * 18, [0] * 9, [0] * 9)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(precision, monkeypatch):
    """Twelve sequences of one pool decoded together (more than one call takes: groups of 8
    and 4) give each sequence the same bits as decoding it alone, and int8 never takes the
    many-row product (which scales all rows' activations together)."""
    from gpt1.inference import quantize

    model = _model(precision)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (1, 2 + i)) for i in range(12)]
    _, together, alone = _pooled_and_alone(model, prompts)
    with torch.no_grad():

        def many_rows(*args):
            raise AssertionError("a decoding step took the many-row int8 product")

        monkeypatch.setattr(quantize.PackedInt8, "linear", many_rows)
        for _ in range(3):
            ids = torch.randint(0, 300, (12,), generator=gen)
            got = decode(model, ids, together)
            for r in range(12):
                assert torch.equal(got[r], decode(model, ids[r : r + 1], [alone[r]])[0])


def test_a_tensor_replaced_or_swapped_underneath_is_seen():
    model = _model("fp32")
    x = torch.zeros(1, 64)
    with torch.no_grad():
        first = block_step.plan(model, x)
        kept = block_step._plans[model]
        layer = model.h[0].attn.c_proj
        layer.weight.data = layer.weight.data.clone()  # the same Parameter, another storage
        assert kept.current() and not kept.unchanged()  # MadeFrom sees the new storage
        layer.weight = torch.nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
        assert not kept.current()
        again = block_step.plan(model, x)
    assert again is not first
    assert any(t is layer.weight for t in again.tensors)


@pytest.mark.parametrize("one_call", [True, False])
def test_a_row_that_grows_the_pool_keeps_the_new_keys_of_the_rows_before_it(one_call, monkeypatch):
    """The pool's buffers are replaced when a row outgrows them (64 positions at first). The
    rows listed before it in the step must write into the new buffers: a row given the old
    ones lost its new key and value, and every later step attended zeros in their place."""
    model = _model("int8" if not one_call else "fp32")
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 300, (1, n), generator=gen) for n in (5, 64)]
    pool, pooled, alone = _pooled_and_alone(model, prompts)
    with torch.no_grad():
        capacity = pool.k[0].shape[2]
        assert capacity == len(pooled[1])  # the second row's next token does not fit
        for _ in range(3):
            ids = torch.randint(0, 300, (2,), generator=gen)
            got = decode(model, ids, pooled, one_call=one_call)
            with _operators_only(monkeypatch):
                want = [forward_cached(model, ids[i].view(1, 1), alone[i])[0, -1] for i in (0, 1)]
            for r in (0, 1):
                _close(got[r], want[r], "fp32" if one_call else "int8")
    assert pool.k[0].shape[2] > capacity
    for layer, mine in zip(alone[0].layers, pool.k):
        _close(mine[pooled[0].slot, :, :8], layer.k[0, :, :8], "fp32" if one_call else "int8")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_a_few_positions_of_one_sequence_take_one_call_and_give_each_positions_bits(
    precision, monkeypatch
):
    """forward_cached of 2..8 new tokens (a verifying pass of drafted tokens) runs the step once,
    each position a row attending to the rows before it, and gives the hidden states and cache
    contents of decoding the tokens one by one, bit for bit: speculative greedy decoding then
    chooses plain decoding's tokens exactly."""
    model = _model(precision)
    gen = torch.Generator().manual_seed(5)
    calls = []
    run = block_step.BlockStep.run

    def counted(self, x, *args):
        calls.append(x.shape[0])
        return run(self, x, *args)

    monkeypatch.setattr(block_step.BlockStep, "run", counted)
    for T in (2, 5, 8):
        prompt = torch.randint(0, 300, (1, 60), generator=gen)  # 60 + 8 outgrows 64 positions
        new = torch.randint(0, 300, (1, T), generator=gen)
        together, one_by_one = KVCache(2, 80), KVCache(2, 80)
        with torch.no_grad():
            forward_cached(model, prompt, together)
            forward_cached(model, prompt, one_by_one)
            calls.clear()
            got = forward_cached(model, new, together)[0]
            assert calls == [T]
            want = torch.cat(
                [forward_cached(model, new[:, i : i + 1], one_by_one)[0] for i in range(T)]
            )
        assert torch.equal(got, want)
        assert len(together) == len(one_by_one) == 60 + T
        for mine, theirs in zip(together.layers, one_by_one.layers):
            assert torch.equal(mine.k[:, :, : 60 + T], theirs.k[:, :, : 60 + T])
            assert torch.equal(mine.v[:, :, : 60 + T], theirs.v[:, :, : 60 + T])
