"""Pooled key/value caches (`gpt1.inference.decoding`): many sequences' attention in one call per
layer gives what each sequence's own cache gives, as sequences of different lengths join and
leave, and the pool hands slots out and frees its memory as it should. These are the operator
path's tests: the one-call step (`gpt1.inference.block_step`) is off here, and
`tests/test_block_step.py` checks it against this path."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpt1 import GPT, ModelConfig
from gpt1.inference.decoding import (
    KVCache,
    LoopStep,
    PooledStep,
    SlotPool,
    decode,
    decode_step,
    forward_cached,
)

pytestmark = pytest.mark.usefixtures("decoding_operators")


def _model(dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=80, n_embd=64, n_layer=2, n_head=4)
    return GPT(config).eval().to(dtype)


def _prefill(model: GPT, prompt: torch.Tensor, *caches: KVCache) -> None:
    for cache in caches:
        forward_cached(model, prompt, cache)


def test_pooled_decoding_equals_each_sequence_alone_as_sequences_join_and_leave():
    """Five sequences of different lengths; two leave (holes in the slot range, and a newcomer
    reuses one), one joins late, rows are passed out of slot order; every step's hidden states
    equal each sequence's own forward with a plain cache."""
    model = _model()
    pool = SlotPool(2, 80)
    gen = torch.Generator().manual_seed(1)
    prompts = {
        key: torch.randint(0, 300, (1, n), generator=gen) for key, n in enumerate((5, 1, 17, 9, 3))
    }
    pooled, alone = {}, {}
    with torch.no_grad():
        for key in (0, 1, 2, 3):
            pooled[key], alone[key] = pool.cache(), KVCache(2, 80)
            _prefill(model, prompts[key], pooled[key], alone[key])
        for step in range(12):
            if step == 3:  # slots 1 and 2 leave: holes between slots 0 and 3
                for key in (1, 2):
                    pooled.pop(key).release()
                    alone.pop(key)
            if step == 5:  # joins in the lowest free slot (1)
                pooled[4], alone[4] = pool.cache(), KVCache(2, 80)
                _prefill(model, prompts[4], pooled[4], alone[4])
                assert pooled[4].slot == 1
            keys = sorted(pooled, reverse=step % 2 == 1)  # rows in and out of slot order
            ids = torch.randint(0, 300, (len(keys),), generator=gen)
            assert isinstance(decode_step([pooled[k] for k in keys]), PooledStep)
            together = decode(model, ids, [pooled[k] for k in keys])
            for r, key in enumerate(keys):
                want = forward_cached(model, ids[r].view(1, 1), alone[key])[0, -1]
                torch.testing.assert_close(together[r], want, rtol=1e-5, atol=1e-5)
                assert len(pooled[key]) == len(alone[key])


def test_pooled_and_looped_attention_agree_in_bf16():
    model = _model(torch.bfloat16)
    pool = SlotPool(2, 80)
    prompts = [torch.randint(0, 300, (1, n)) for n in (4, 11, 2)]
    pooled = [pool.cache() for _ in prompts]
    plain = [KVCache(2, 80) for _ in prompts]
    ids = torch.randint(0, 300, (3,))
    with torch.no_grad():
        for p, a, b in zip(prompts, pooled, plain):
            _prefill(model, p, a, b)
        assert isinstance(decode_step(plain), LoopStep)
        torch.testing.assert_close(
            decode(model, ids, pooled).float(),
            decode(model, ids, plain).float(),
            rtol=2e-2,
            atol=2e-2,
        )


def test_pooled_decoding_is_one_attention_call_per_layer(monkeypatch):
    """The point of the pool: n sequences cost one SDPA call per layer, not n."""
    model = _model()
    pool = SlotPool(2, 80)
    caches = [pool.cache() for _ in range(4)]
    with torch.no_grad():
        for n, cache in zip((3, 8, 1, 5), caches):
            forward_cached(model, torch.randint(0, 300, (1, n)), cache)
        calls, sdpa = [], F.scaled_dot_product_attention

        def counted(*args, **kwargs):
            calls.append(1)
            return sdpa(*args, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
        decode(model, torch.randint(0, 300, (4,)), caches)
    assert len(calls) == model.config.n_layer


def test_the_pool_hands_out_the_lowest_free_slot_and_frees_memory_when_empty():
    model = _model()
    pool = SlotPool(2, 80)
    a, b, c = pool.cache(), pool.cache(), pool.cache()
    assert [a.slot, b.slot, c.slot] == [0, 1, 2]
    with torch.no_grad():
        forward_cached(model, torch.randint(0, 300, (1, 70)), c)  # past the first capacity (64)
    assert pool.k[0].shape[0] >= 3 and pool.k[0].shape[2] == 80  # capped at max_length
    b.release()
    b.release()  # twice is harmless
    assert pool.cache().slot == 1
    for cache in (a, c):
        cache.release()
    assert pool.k[0] is not None  # slot 1 is still live
    pool.release(1)
    assert pool.k == [None, None] and pool.taken == []


def test_sparse_slots_are_attended_one_by_one():
    """Two live sequences in slots 0 and 5 of a pool: one call would attend six rows for two."""
    model = _model()
    pool = SlotPool(2, 80)
    caches = [pool.cache() for _ in range(6)]
    with torch.no_grad():
        for cache in caches:
            forward_cached(model, torch.randint(0, 300, (1, 4)), cache)
    assert isinstance(decode_step(caches), PooledStep)
    for cache in caches[1:5]:
        cache.release()
    assert isinstance(decode_step([caches[0], caches[5]]), LoopStep)


def test_the_batched_decoder_gives_each_generation_a_slot_and_takes_it_back():
    from gpt1.inference.batched import BatchedDecoder
    from gpt1.inference.sampling import Sampling

    decoder = BatchedDecoder(_model())
    first = decoder.add([1, 2, 3], Sampling(max_new_tokens=4, temperature=0))
    second = decoder.add([4, 5], Sampling(max_new_tokens=2, temperature=0))
    decoder.step()  # both prompts run alone, each into its slot
    assert (first.cache.slot, second.cache.slot) == (0, 1)
    assert isinstance(decode_step([first.cache, second.cache]), PooledStep)
    decoder.stop(first)  # a client leaves: its slot is free for the next one
    assert decoder.pool.taken == [False, True]
    while decoder.active:
        decoder.step()
    assert decoder.pool.taken == [] and decoder.pool.k == [None, None]  # memory freed


def test_a_cached_pass_under_activation_checkpointing_writes_each_key_once():
    """Activation checkpointing recomputes a block during backward; a pass that writes a key/value
    cache must run once (a recomputation would append the same keys again)."""
    from gpt1.train.parallelize import checkpoint_blocks

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=80, n_embd=64, n_layer=2, n_head=4)
    model = GPT(config).train()
    plain = GPT(config).train()
    plain.load_state_dict(model.state_dict())
    assert checkpoint_blocks(model) == 2
    ids = torch.randint(0, 300, (1, 9))
    hidden, cache = [], []
    for m in (model, plain):
        cache.append(KVCache(2, 80))
        torch.manual_seed(1)
        hidden.append(forward_cached(m, ids, cache[-1]))
        hidden[-1].square().sum().backward()
    assert len(cache[0]) == len(cache[1]) == 9
    assert torch.equal(hidden[0], hidden[1])
    for got, want in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(got.grad, want.grad)


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lengths=st.lists(st.sampled_from([1, 2, 5, 9]), min_size=1, max_size=6),
    cached=st.lists(st.booleans(), min_size=6, max_size=6),
    pooled=st.booleans(),
    bf16=st.booleans(),
    last_only=st.booleans(),
    stores=st.sampled_from([None, torch.bfloat16, torch.int8]),
)
@example(
    lengths=[5, 5, 5], cached=[False] * 6, pooled=True, bf16=True, last_only=False, stores=None
)  # one group
@example(
    lengths=[5, 5, 5], cached=[False] * 6, pooled=False, bf16=False, last_only=True, stores=None
)
@example(
    lengths=[9, 2, 9, 9],
    cached=[False, False, True, False] + [False] * 2,
    pooled=True,
    bf16=False,
    last_only=True,
    stores=torch.int8,
)
def test_prompts_read_together_attend_as_each_alone_bit_for_bit(
    lengths, cached, pooled, bf16, last_only, stores
):
    """`PromptRows` (the layout of `prefill`) groups fresh prompts of one length into one
    attention call; every row, and every cache it writes, is the bits of the sequence's own
    `CachedTokens` call, whatever mix of lengths, filled caches and cache kinds comes, and
    whatever the caches store (the activations' dtype, bf16, int8 rows). Asked
    for each prompt's last row alone (`last_only`, the last block's layout), it gives those
    rows of the full answer, and the same caches."""
    from gpt1.inference.decoding import CachedTokens, PromptRows

    dtype = torch.bfloat16 if bf16 else torch.float32
    H, D = 4, 16
    gen = torch.Generator().manual_seed(len(lengths))
    qkv = torch.randn(sum(lengths), 3 * H * D, generator=gen).to(dtype)
    history = torch.randn(len(lengths), 3, 1, H, 3, D, generator=gen).to(dtype)

    def caches() -> list:
        pool = SlotPool(1, 80, stores)
        made = [pool.cache() if pooled else KVCache(1, 80, stores) for _ in lengths]
        for i, cache in enumerate(made):
            if cached[i]:  # three positions already held: this prompt continues them
                cache.layers[0].extend(history[i, 1], history[i, 2])
        return made

    together, alone, full = caches(), caches(), caches()
    with torch.no_grad():
        layout = PromptRows([c.layers[0] for c in together], lengths, last_only)
        got = layout.attend(qkv, H, 0.0)
        want = torch.cat(
            [
                CachedTokens(c.layers[0], last_only).attend(part[None], H, 0.0)[0]
                for c, part in zip(alone, qkv.split(lengths))
            ]
        )
        every_row = PromptRows([c.layers[0] for c in full], lengths).attend(qkv, H, 0.0)
    assert torch.equal(got, want)
    ends = torch.tensor(lengths).cumsum(0) - 1
    assert got.shape[0] == (len(lengths) if last_only else sum(lengths))
    # One query against the last row of T causal ones: the same sums, perhaps in another order.
    tolerance = 1e-2 if bf16 else 1e-5
    expected = every_row[ends] if last_only else every_row
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    assert torch.equal(layout.query_rows(qkv), qkv[ends] if last_only else qkv)
    for a, b in zip(together + together, alone + full):
        assert len(a) == len(b)
        ka, va = a.layers[0].extend(qkv[:0].view(1, H, 0, D), qkv[:0].view(1, H, 0, D))
        kb, vb = b.layers[0].extend(qkv[:0].view(1, H, 0, D), qkv[:0].view(1, H, 0, D))
        assert torch.equal(ka, kb) and torch.equal(va, vb)


@pytest.mark.parametrize("past", [0, 3])
def test_a_pass_read_for_its_last_position_runs_the_last_block_on_that_row(past):
    """`forward_cached(..., last_only=True)`, what a prompt before its first token runs: the
    last position's hidden state of the full pass, the same caches, and the last block's MLP
    given one row a sequence instead of every new position."""
    model = _model()
    gen = torch.Generator().manual_seed(past)
    history = torch.randint(0, 300, (2, past), generator=gen)
    ids = torch.randint(0, 300, (2, 7), generator=gen)
    seen: list[tuple[int, ...]] = []
    hook = model.h[-1].mlp.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    last, full = KVCache(2, 80), KVCache(2, 80)
    with torch.no_grad():
        for cache in (last, full):
            if past:
                forward_cached(model, history, cache)
        seen.clear()
        got = forward_cached(model, ids, last, last_only=True)
        assert seen == [(2, 1, 64)]
        want = forward_cached(model, ids, full)
    hook.remove()
    assert got.shape == (2, 1, 64)
    torch.testing.assert_close(got, want[:, -1:], rtol=1e-5, atol=1e-5)
    assert len(last) == len(full) == past + 7
    for a, b in zip(last.layers, full.layers):
        empty = ids.new_zeros(2, 4, 0, 16, dtype=torch.float32)
        assert all(
            torch.equal(x, y) for x, y in zip(a.extend(empty, empty), b.extend(empty, empty))
        )
