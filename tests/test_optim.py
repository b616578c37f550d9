"""Schedules, the exact OAI Adam update, and which parameters decay."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from gpt1.config import TrainConfig, model_preset
from gpt1.model.gpt import GPT
from gpt1.train.optim import OAIAdam, build_optimizer, lr_at, lr_multiplier, param_groups


def test_warmup_cosine_values():
    total, warm = 1000, 100
    assert lr_multiplier(0, total, warm, "warmup_cosine") == 0.0
    assert lr_multiplier(50, total, warm, "warmup_cosine") == pytest.approx(0.5)
    assert lr_multiplier(100, total, warm, "warmup_cosine") == pytest.approx(1.0)
    # after warm-up OAI uses 0.5 (1 + cos(pi x)) of the whole progress, not renormalised
    assert lr_multiplier(101, total, warm, "warmup_cosine") == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 0.101))
    )
    assert lr_multiplier(500, total, warm, "warmup_cosine") == pytest.approx(0.5)
    assert lr_multiplier(1000, total, warm, "warmup_cosine") == pytest.approx(0.0, abs=1e-12)


def test_warmup_linear_and_fraction():
    # OAI fine-tuning: warmup 0.002 of 138 updates (< 1 step), then (1 - x)
    assert lr_multiplier(0, 138, 0.002, "warmup_linear") == 0.0
    assert lr_multiplier(1, 138, 0.002, "warmup_linear") == pytest.approx(1 - 1 / 138)
    assert lr_multiplier(69, 138, 0.002, "warmup_linear") == pytest.approx(0.5)
    # the warm-up ramp is multiplied by (1 - x) too
    assert lr_multiplier(5, 100, 10, "warmup_linear") == pytest.approx(0.5 * 0.95)
    assert lr_multiplier(7, 100, 10, "constant") == 1.0
    assert lr_multiplier(20, 100, 10, "warmup_constant") == 1.0


def test_first_step_convention():
    cfg = TrainConfig(lr=1.0, warmup=10, schedule="warmup_cosine")
    assert lr_at(0, cfg, 100) == 0.0  # OAI quirk: first update has lr 0
    cfg = dataclasses.replace(cfg, oai_first_step=False)
    assert lr_at(0, cfg, 100) == pytest.approx(0.1)


def test_oai_adam_matches_hand_computed_steps():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(3, 4))
    b = nn.Parameter(torch.randn(4))
    opt = OAIAdam(
        [{"params": [w], "weight_decay": 0.01}, {"params": [b], "weight_decay": 0.0}],
        lr=0.1,
        betas=(0.9, 0.999),
        eps=1e-8,
    )
    w0, b0 = w.detach().clone().double(), b.detach().clone().double()
    m_w = torch.zeros_like(w0)
    v_w = torch.zeros_like(w0)
    m_b = torch.zeros_like(b0)
    v_b = torch.zeros_like(b0)
    for t in (1, 2, 3):
        gw, gb = torch.randn(3, 4), torch.randn(4)
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
        lrt = 0.1 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        m_w = 0.9 * m_w + 0.1 * gw.double()
        v_w = 0.999 * v_w + 0.001 * gw.double() ** 2
        m_b = 0.9 * m_b + 0.1 * gb.double()
        v_b = 0.999 * v_b + 0.001 * gb.double() ** 2
        w0 = w0 - lrt * (m_w / (v_w.sqrt() + 1e-8) + 0.01 * w0)  # L2 scaled by lrt
        b0 = b0 - lrt * (m_b / (v_b.sqrt() + 1e-8))  # no decay on vectors
        torch.testing.assert_close(w.detach().double(), w0, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.detach().double(), b0, rtol=1e-5, atol=1e-6)


def test_decay_only_on_matrices():
    model = GPT(model_preset("tiny"))
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert "wte.weight" in decayed and "wpe.weight" in decayed
    assert "h.0.attn.c_attn.weight" in decayed and "h.1.mlp.c_proj.weight" in decayed
    assert "h.0.ln_1.weight" in kept and "h.0.attn.c_attn.bias" in kept
    assert all(p.dim() > 1 for p in decay["params"]) and all(
        p.dim() == 1 for p in no_decay["params"]
    )
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert len(decayed) + len(kept) == len(list(model.parameters()))


def test_zero_gradient_still_decays_matrix_only():
    # With zero gradients, the OAI update moves only decayed tensors, by lrt * l2 * p.
    model = GPT(model_preset("tiny"))
    cfg = TrainConfig(lr=0.1, weight_decay=0.5)
    opt = build_optimizer(model, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    lrt = 0.1 * math.sqrt(1 - 0.999) / (1 - 0.9)
    for n, p in model.named_parameters():
        if p.dim() > 1:
            torch.testing.assert_close(p.detach(), before[n] * (1 - lrt * 0.5))
        else:
            assert torch.equal(p.detach(), before[n])


def test_adamw_option_builds_and_steps():
    model = GPT(model_preset("tiny"))
    opt = build_optimizer(model, TrainConfig(optimizer="adamw", lr=1e-3))
    assert isinstance(opt, torch.optim.AdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    model(torch.randint(0, 512, (2, 8))).sum().backward()
    opt.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_fused_oai_adam_matches_foreach_reference(weight_decay):
    # The fused kernel is fed rescaled eps / decay; it must give OAI's update to fp32 rounding.
    torch.manual_seed(0)
    a, b = GPT(model_preset("tiny")), GPT(model_preset("tiny"))
    b.load_state_dict(a.state_dict())
    initial = {n: p.detach().clone() for n, p in a.named_parameters()}
    fused = OAIAdam(param_groups(a, weight_decay), lr=1e-2, fused=True)
    ref = OAIAdam(param_groups(b, weight_decay), lr=1e-2, fused=False)
    for step in range(5):
        for pa, pb in zip(a.parameters(), b.parameters()):
            g = torch.randn_like(pa) * (step + 1)
            pa.grad, pb.grad = g.clone(), g.clone()
        fused.step()
        ref.step()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        # Within two fp32 ulps: the fused kernel's FMAs may round the last bit differently from the
        # foreach reference, depending on which vector ISA the CPU build picks.
        torch.testing.assert_close(pa, pb, rtol=2.4e-7, atol=1e-7, msg=name)
        assert not torch.equal(pa, initial[name]), name  # the steps did move it
    sa, sb = fused.state_dict()["state"], ref.state_dict()["state"]
    assert float(sa[0]["step"]) == float(sb[0]["step"]) == 5.0
    torch.testing.assert_close(sa[0]["exp_avg_sq"], sb[0]["exp_avg_sq"], rtol=1e-6, atol=0)
