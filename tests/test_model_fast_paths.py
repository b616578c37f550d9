"""The CPU fast paths in gpt1.model compute the same maths as torch's reference ops."""
import math

import torch
import torch.nn.functional as F

from gpt1 import GPT, ModelConfig
from gpt1.model import causal_attention_cpu_train, dropout


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
    w = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(
        torch.ones(17, 17, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    assert torch.allclose(ours, dropout(w, 0.1, True) @ v, atol=1e-6)


def test_training_forward_is_causal():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)).train()
    ids = torch.randint(0, 50, (2, 16))
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 50
    torch.manual_seed(3)
    a = model(ids)
    torch.manual_seed(3)  # same dropout masks
    b = model(changed)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.equal(a[:, 10:], b[:, 10:])
