"""The memory-lean CPU training attention (softmax -> dropout -> @ v as one autograd Function)."""

from __future__ import annotations

import math

import pytest
import torch

from gpt1.model.fast_cpu import causal_attention_cpu_train, dropout


def reference(q, k, v, p):
    """Plain autograd: masked scores, softmax, the project's dropout, @ v."""
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")
    )
    return dropout(s.softmax(-1), p, True) @ v


@pytest.fixture(params=[False, True], ids=["saved", "recomputed"])
def recompute(request, monkeypatch):
    """Run a test with the probabilities kept for backward and with them recomputed."""
    import gpt1.model.fast_cpu as model

    if request.param:
        monkeypatch.setattr(model, "RECOMPUTE_PROBS_BYTES", 0)
    return request.param


@pytest.mark.parametrize("p", [0.1, 0.25])
def test_values_and_gradients_equal_plain_autograd(p, recompute):
    base = [t.requires_grad_() for t in torch.randn(3, 2, 3, 19, 8).unbind(0)]
    g = torch.randn(2, 3, 19, 8)
    torch.manual_seed(7)
    ours = causal_attention_cpu_train(*base, p)
    grads = torch.autograd.grad((ours * g).sum(), base)
    torch.manual_seed(7)  # the same dropout draws
    ref = reference(*base, p)
    ref_grads = torch.autograd.grad((ref * g).sum(), base)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert grads[0].abs().sum() > 0


def test_bf16_autocast_dtypes_and_closeness(recompute):
    base = [t.requires_grad_() for t in torch.randn(3, 2, 2, 16, 8).unbind(0)]
    torch.manual_seed(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = (t * 1.0 for t in base)
        ours = causal_attention_cpu_train(q, k, v, 0.1)
    assert ours.dtype == torch.bfloat16
    grads = torch.autograd.grad(ours.float().sum(), base)
    torch.manual_seed(3)
    ref_grads = torch.autograd.grad(reference(*base, 0.1).sum(), base)
    for a, b in zip(grads, ref_grads):
        assert a.dtype == torch.float32
        assert float((a - b).norm() / b.norm()) < 3e-2


def test_saves_no_dropped_probabilities(recompute):
    # Saved for backward: q, k, v, the keep mask (uint8) and probs (fp32) unless recomputed;
    # never the dropped probabilities.
    q, k, v = (t.requires_grad_() for t in torch.randn(3, 1, 2, 64, 8).unbind(0))
    sizes = []

    def pack(t):
        sizes.append((t.dtype, t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        causal_attention_cpu_train(q, k, v, 0.1)
    big_float = [n for dt, n in sizes if dt.is_floating_point and n == 2 * 64 * 64]
    assert len(big_float) == (0 if recompute else 1)
    assert [n for dt, n in sizes if dt == torch.uint8] == [2 * 64 * 64]


def test_long_rows_in_place_softmax_and_backward_match_plain_autograd(recompute):
    # Rows of 128 and 200 exercise the vectorised kernels that now write into their inputs.
    for T in (128, 200):
        base = [t.requires_grad_() for t in torch.randn(3, 2, 2, T, 16).unbind(0)]
        g = torch.randn(2, 2, T, 16)
        torch.manual_seed(11)
        ours = causal_attention_cpu_train(*base, 0.1)
        grads = torch.autograd.grad((ours * g).sum(), base)
        torch.manual_seed(11)
        ref = reference(*base, 0.1)
        ref_grads = torch.autograd.grad((ref * g).sum(), base)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
