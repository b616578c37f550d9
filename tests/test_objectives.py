"""The chunked tied-head cross-entropy (custom autograd Function) against plain F.cross_entropy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpt1.train.chunked_ce import chunked_cross_entropy


def reference(h, w, y, wt):
    """sum_i wt_i * CE(h_i W^T, y_i) through autograd, ignoring negative targets."""
    ce = F.cross_entropy(h @ w.t(), y.clamp_min(0), reduction="none")
    return (ce * wt).sum()


def inputs(n=37, c=24, v=101, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, c, generator=g) * scale).requires_grad_()
    w = (torch.randn(v, c, generator=g) * 0.3).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    y[::5] = -100  # ignored targets carry weight 0
    wt = torch.rand(n, generator=g)  # non-uniform per-row weights
    wt[y < 0] = 0.0
    return h, w, y, wt


@pytest.mark.parametrize("chunk", [1, 8, 37, 4096])
def test_fp32_value_and_gradients_equal_plain_cross_entropy(chunk):
    h, w, y, wt = inputs()
    ours = chunked_cross_entropy(h, w, y, wt, chunk=chunk)
    (3.0 * ours).backward()  # upstream gradient is applied
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = reference(h, w, y, wt)
    (3.0 * ref).backward()
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh, h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, w.grad, rtol=1e-5, atol=1e-6)
    assert gh[y < 0].abs().max() == 0  # ignored rows get no gradient


def test_bf16_autocast_close_to_fp32_reference():
    h, w, y, wt = inputs(n=64, c=32, v=300, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = chunked_cross_entropy(h, w, y, wt, chunk=24)
    ours.backward()
    assert ours.dtype == torch.float32 and h.grad.dtype == w.grad.dtype == torch.float32
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = reference(h, w, y, wt)
    ref.backward()
    assert abs(ours.item() - ref.item()) < 2e-2 * ref.item()
    # bf16 operands: gradients agree to bf16 precision, relative to their scale
    for a, b in ((gh, h.grad), (gw, w.grad)):
        assert float((a - b).norm() / b.norm()) < 2e-2


def test_underflowing_target_probability_stays_finite_and_exact():
    # Logits of ~1e3: the target's softmax probability underflows to 0 in fp32, yet the loss
    # must be the exact logsumexp - logit, not inf.
    h, w, y, wt = inputs(n=10, c=8, v=50, seed=2, scale=300.0)
    ours = chunked_cross_entropy(h, w, y, wt, chunk=4)
    ref = reference(h.double(), w.double(), y, wt.double()).item()
    assert torch.isfinite(ours)
    assert ref > 100  # the case actually underflows
    assert abs(ours.item() - ref) < 1e-4 * ref


def test_no_grad_evaluation_computes_value_only():
    h, w, y, wt = inputs()
    with torch.no_grad():
        ours = chunked_cross_entropy(h, w, y, wt, chunk=8)
    assert not ours.requires_grad
    torch.testing.assert_close(ours, reference(h, w, y, wt).detach(), rtol=1e-6, atol=1e-6)


def test_element_cap_splits_large_vocab_into_more_chunks(monkeypatch):
    # A vocabulary-sized cap on logits per chunk (memory bound) must not change the result.
    import gpt1.train.chunked_ce as chunked_ce

    h, w, y, wt = inputs()
    ref = chunked_cross_entropy(h, w, y, wt, chunk=4096)
    ref.backward()
    gw_ref = w.grad.clone()
    w.grad = h.grad = None
    monkeypatch.setattr(chunked_ce, "CHUNK_ELEMENTS", 3 * w.shape[0])  # 3 rows per chunk
    calls = []
    real = chunked_ce._softmax_minus_onehot_
    monkeypatch.setattr(
        chunked_ce,
        "_softmax_minus_onehot_",
        lambda logits, *a: calls.append(logits.shape) or real(logits, *a),
    )
    ours = chunked_cross_entropy(h, w, y, wt, chunk=4096)
    ours.backward()
    assert len(calls) == 13 and calls[0][0] == 3  # ceil(37 / 3) chunks
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w.grad, gw_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_blocks_in_place_equal_torch_softmax(monkeypatch, dtype):
    # The CPU path converts logits in place, block by block through one reused buffer.
    import gpt1.train.chunked_ce as chunked_ce

    monkeypatch.setattr(chunked_ce, "_BLOCK_ELEMENTS", 3 * 50)  # 3-row blocks, last one partial
    logits = (torch.randn(20, 50) * 4).to(dtype)
    idx = torch.randint(0, 50, (20, 1))
    probs = torch.softmax(logits.float(), 1)
    p = chunked_ce._softmax_minus_onehot_(logits, idx, True)
    torch.testing.assert_close(p, probs.gather(1, idx).squeeze(1))
    expected = probs.scatter_add(1, idx, -torch.ones(20, 1)).to(dtype)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0 if dtype == torch.float32 else 4e-3)
