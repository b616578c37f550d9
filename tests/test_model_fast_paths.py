"""The CPU fast paths in gpt1.model.gpt compute the same maths as torch's reference ops."""

import math

import pytest
import torch
import torch.nn.functional as F

from gpt1 import GPT, ModelConfig
from gpt1.model.fast_cpu import causal_attention_cpu_train, dropout


def test_dropout_rate_scale_and_gradient():
    torch.manual_seed(0)
    x = torch.randn(1000, 1000, requires_grad=True)
    y = dropout(x, 0.1, True)
    kept = y != 0
    rate = 1 - kept.float().mean().item()
    assert abs(rate - 0.1) < 0.002  # 1M draws: std of the rate is 0.0003
    assert torch.allclose(y[kept], x[kept] / 0.9)
    y.backward(torch.ones_like(y))
    assert torch.allclose(x.grad, kept.float() / 0.9)


def test_dropout_other_rates_and_eval():
    x = torch.randn(200, 500)
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    for p in (0.25, 0.123456789):  # exact small fraction, and one that falls back to F.dropout
        rate = 1 - (dropout(x, p, True) != 0).float().mean().item()
        assert abs(rate - p) < 0.01


def test_dropout_follows_the_global_seed():
    x = torch.randn(64, 64)
    torch.manual_seed(5)
    a = dropout(x, 0.1, True)
    torch.manual_seed(5)
    assert torch.equal(a, dropout(x, 0.1, True))


def test_cpu_attention_without_dropout_equals_sdpa():
    q, k, v = torch.randn(3, 2, 4, 17, 8).unbind(0)
    ours = causal_attention_cpu_train(q, k, v, 0.0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(ours, ref, atol=1e-6)


def test_cpu_attention_with_dropout_matches_explicit_formula():
    q, k, v = torch.randn(3, 2, 4, 17, 8).unbind(0)
    torch.manual_seed(1)
    ours = causal_attention_cpu_train(q, k, v, 0.1)
    torch.manual_seed(1)  # same draws: rebuild them through the public dropout helper
    w = (
        (q @ k.transpose(-1, -2) / math.sqrt(8))
        .masked_fill(torch.ones(17, 17, dtype=torch.bool).triu(1), float("-inf"))
        .softmax(-1)
    )
    assert torch.allclose(ours, dropout(w, 0.1, True) @ v, atol=1e-6)


def test_training_forward_is_causal(tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config(vocab_size=50, n_positions=16)).train()
    ids = torch.randint(0, 50, (2, 16))
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 50
    torch.manual_seed(3)
    a = model(ids)
    torch.manual_seed(3)  # same dropout masks
    b = model(changed)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.equal(a[:, 10:], b[:, 10:])


def test_keep_mask_rate_is_exact_including_the_redrawn_values(monkeypatch):
    """Every 16-bit value maps to keep/drop in equal buckets; values past the last whole bucket
    are redrawn, so the drop rate is exactly num/den. Fed all 65536 values once, the buckets
    alone must drop exactly num * (65536 // den) of them."""
    import numpy as np

    from gpt1.model import masks as model_mod

    real_bits = np.random.SFC64

    class AllValues:  # random_raw yields each int16 value exactly once
        def __init__(self, seed):
            self.real = real_bits(seed)

        def random_raw(self, size):
            offsets = np.arange(65536, dtype=np.int32) - 32768  # -32768 ... 32767
            return offsets.astype(np.int16).view(np.uint64)[:size].copy()

    real_generator = np.random.Generator
    monkeypatch.setattr(model_mod.np.random, "SFC64", AllValues)
    monkeypatch.setattr(model_mod.np.random, "Generator", lambda bits: real_generator(bits.real))
    for num, den in ((1, 10), (1, 3), (3, 7)):
        keep = model_mod.keep_mask((65536,), num, den)
        bucket = 65536 // den
        leftover = 65536 - bucket * den
        dropped_in_buckets = (keep[: bucket * den] == 0).sum().item()
        assert keep.dtype == torch.uint8 and set(keep.unique().tolist()) <= {0, 1}
        # the array is in value order from -32768 up, i.e. offset value 0, 1, ..., 65535
        assert dropped_in_buckets == num * bucket
        assert (keep[: num * bucket] == 0).all() and (keep[num * bucket : bucket * den] == 1).all()
        assert keep[bucket * den :].numel() == leftover  # these came from the exact redraw


def test_keep_mask_statistics_and_fresh_draws():
    torch.manual_seed(0)
    a = model_mod_keep((1000, 1000))
    b = model_mod_keep((1000, 1000))
    assert a.shape == (1000, 1000) and not torch.equal(a, b)
    assert abs(1 - a.float().mean().item() - 0.1) < 2e-3  # sd of the rate is 3e-4


def model_mod_keep(shape):
    from gpt1.model.masks import keep_mask

    return keep_mask(shape, 1, 10)


def test_keep_mask_in_16_bit_float_types_is_the_same_mask():
    from gpt1.model.masks import keep_mask

    for dtype in (torch.bfloat16, torch.float16):
        torch.manual_seed(4)
        as_bytes = keep_mask((300, 70), 1, 10)
        torch.manual_seed(4)
        as_float = keep_mask((300, 70), 1, 10, dtype)
        assert as_float.dtype == dtype
        assert torch.equal(as_float.float(), as_bytes.float())


def test_bf16_dropout_values_and_gradient():
    torch.manual_seed(0)
    x = torch.randn(400, 300, dtype=torch.bfloat16, requires_grad=True)
    y = dropout(x, 0.1, True)
    kept = y != 0
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y[kept], (x[kept].float() / 0.9).bfloat16())
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad.float(), (kept.float() / 0.9).bfloat16().float())


def test_keep_mask_chunks_do_not_depend_on_the_thread_count():
    from gpt1.model.masks import CHUNK, keep_mask

    shape = (3, CHUNK + 12345)  # several chunks, a ragged last one
    before = torch.get_num_threads()
    try:
        masks = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            torch.manual_seed(9)
            masks.append(keep_mask(shape, 1, 10, torch.bfloat16))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2])
    flat = masks[0].flatten().float()
    assert not torch.equal(flat[:1000], flat[CHUNK : CHUNK + 1000])  # chunks are independent
    assert abs(1 - flat.mean().item() - 0.1) < 2e-3


class _ConcatCache:
    """The plain key/value cache: a fresh concatenation per step (what LayerCache replaces)."""

    def __init__(self) -> None:
        self.k = self.v = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def extend(self, k: torch.Tensor, v: torch.Tensor):
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


@pytest.mark.usefixtures("decoding_operators")
def test_preallocated_kv_cache_equals_concatenation():
    """Keys/values written in place into growing buffers give bit-identical hidden states to
    concatenated ones, through buffer growth (past 64 positions) and multi-token chunks (the
    operator path: a cache of another kind, as the concatenating one here, never takes the
    one-call step, and that step is checked in tests/test_block_step.py)."""
    from gpt1.inference.decoding import KVCache, forward_cached

    torch.manual_seed(0)
    m = GPT(ModelConfig(vocab_size=300, n_positions=160, n_embd=64, n_layer=2, n_head=4)).eval()
    ids = torch.randint(0, 300, (2, 150))
    chunks = [(0, 3), (3, 4), (4, 40), (40, 70)] + [(i, i + 1) for i in range(70, 150)]
    fast, plain = KVCache(2), KVCache(2)
    plain.layers = [_ConcatCache() for _ in range(2)]
    with torch.no_grad():
        for lo, hi in chunks:
            assert torch.equal(
                forward_cached(m, ids[:, lo:hi], fast), forward_cached(m, ids[:, lo:hi], plain)
            ), (
                lo,
                hi,
            )
    assert len(fast) == len(plain) == 150 and fast.layers[0].k.shape[2] >= 150
