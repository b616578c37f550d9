"""The training loop in-process: losses, accumulation, determinism, divergence, checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpt1.config import TrainConfig, model_preset
from gpt1.model.checkpoint import load_checkpoint
from gpt1.model.gpt import GPT
from gpt1.text.windows import Split, WindowSource
from gpt1.train.chunked_ce import chunked_cross_entropy
from gpt1.train.loop import TrainingDiverged, train
from gpt1.train.objectives import WindowLMLoss, lm_loss, lm_loss_per_sequence
from gpt1.train.state import load_training_state, step_dirs


def tiny_model(seed: int = 0, dropout: float = 0.0) -> GPT:
    torch.manual_seed(seed)
    cfg = model_preset("tiny").derive(embd_pdrop=dropout, attn_pdrop=dropout, resid_pdrop=dropout)
    return GPT(cfg)


def source(seed: int = 0) -> WindowSource:
    rng = np.random.default_rng(123)
    tokens = (np.arange(4000) * 7 % 97 + rng.integers(0, 3, 4000)).astype(np.uint16)
    return WindowSource(Split("train", [tokens[:2500], tokens[2500:]], 4000), 16, seed)


def cfg(**kw) -> TrainConfig:
    base = dict(
        micro_batch_size=2,
        batch_size=4,
        max_steps=4,
        lr=1e-2,
        warmup=1,
        save_every=0,
        eval_every=0,
        log_every=1,
        quiet=True,
        peak_flops=1.0,
        seed=0,
    )
    base.update(kw)
    return TrainConfig(**base)


def losses(run_dir) -> list[float]:
    return [
        json.loads(l)["loss"]
        for l in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(l)
    ]


# ------------------------------------------------------------------------------- losses
@pytest.mark.parametrize("masked", [False, True])
def test_chunked_loss_equals_plain_cross_entropy(masked):
    torch.manual_seed(0)
    model = tiny_model()
    ids = torch.randint(0, 512, (3, 20))
    mask = (torch.rand(3, 20) > 0.3).long() if masked else None
    hidden = model(ids)
    ours = lm_loss(model, hidden, ids, mask, chunk=7)
    g_ours = torch.autograd.grad(ours, [model.wte.weight, model.h[0].attn.c_attn.weight])
    hidden = model(ids)
    ce = F.cross_entropy(
        model.lm_logits(hidden[:, :-1]).transpose(1, 2), ids[:, 1:], reduction="none"
    )
    m = torch.ones_like(ce) if mask is None else mask[:, 1:].float()
    ref = (ce * m).sum() / m.sum()
    g_ref = torch.autograd.grad(ref, [model.wte.weight, model.h[0].attn.c_attn.weight])
    torch.testing.assert_close(ours, ref)
    for a, b in zip(g_ours, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_chunked_loss_bf16_close_to_fp32():
    torch.manual_seed(0)
    h, w = torch.randn(50, 32), torch.randn(100, 32) * 0.1
    y, wt = torch.randint(0, 100, (50,)), torch.full((50,), 1 / 50)
    ref = chunked_cross_entropy(h, w, y, wt, chunk=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = chunked_cross_entropy(h, w, y, wt, chunk=16)
    assert low.dtype == torch.float32
    assert abs(float(low) - float(ref)) < 2e-2 and float(low) != float(ref)


def test_lm_loss_per_sequence_ignores_pads():
    model = tiny_model()
    ids = torch.randint(1, 512, (2, 10))
    mask = torch.ones(2, 10)
    mask[1, 6:] = 0
    per_seq = lm_loss_per_sequence(model, model(ids), ids, mask)
    logits = model.lm_logits(model(ids))
    ce = F.cross_entropy(logits[1, :5], ids[1, 1:6])  # row 1: targets 1..5 are real
    torch.testing.assert_close(per_seq[1], ce)
    assert per_seq.shape == (2,)


def test_lm_loss_sequence_mean_equals_the_mean_of_per_sequence_losses():
    from gpt1.train.objectives import lm_loss_sequence_mean

    model = tiny_model()
    ids = torch.randint(1, 512, (3, 10))
    mask = torch.ones(3, 10)
    mask[1, 6:] = 0
    mask[2, 1:] = 0  # no real target at all: counts as 0
    hidden = model(ids)
    ref = lm_loss_per_sequence(model, hidden, ids, mask).mean()
    ref_grads = torch.autograd.grad(ref, [hidden, model.wte.weight])
    hidden = model(ids)
    fused = lm_loss_sequence_mean(model, hidden, ids, mask, chunk=4)  # several chunks
    grads = torch.autograd.grad(fused, [hidden, model.wte.weight])
    torch.testing.assert_close(fused, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert grads[0][2].abs().sum() == 0 and grads[0][1, 6:].abs().sum() == 0


# ------------------------------------------------------------------------------- loop
def test_accumulation_equals_large_batch(tmp_path):
    a, b = tiny_model(), tiny_model()
    train(a, WindowLMLoss(), source(), cfg(micro_batch_size=4, batch_size=4), tmp_path / "a")
    train(b, WindowLMLoss(), source(), cfg(micro_batch_size=1, batch_size=4), tmp_path / "b")
    np.testing.assert_allclose(losses(tmp_path / "a"), losses(tmp_path / "b"), rtol=1e-5)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)


def test_same_seed_same_losses_and_training_learns(tmp_path):
    r1 = train(tiny_model(dropout=0.1), WindowLMLoss(), source(), cfg(max_steps=8), tmp_path / "1")
    r2 = train(tiny_model(dropout=0.1), WindowLMLoss(), source(), cfg(max_steps=8), tmp_path / "2")
    assert losses(tmp_path / "1") == losses(tmp_path / "2")
    assert r1.last_loss < losses(tmp_path / "1")[0] - 0.3  # it learns the periodic stream
    assert (tmp_path / "1" / "final" / "model.safetensors").is_file()
    train(
        tiny_model(dropout=0.1), WindowLMLoss(), source(), cfg(max_steps=8, seed=1), tmp_path / "3"
    )
    assert losses(tmp_path / "3") != losses(tmp_path / "1")
    assert r2.step == 8


def test_checkpoints_keep_last_and_carry_state(tmp_path):
    train(
        tiny_model(),
        WindowLMLoss(),
        source(),
        cfg(max_steps=6, save_every=1, keep_last=2),
        tmp_path,
    )
    assert [p.name for p in step_dirs(tmp_path)] == ["step-5", "step-6"]
    tensors, meta = load_training_state(tmp_path / "step-6")
    assert (
        meta["step"] == 6 and "rng/0/cpu" in tensors and tensors["rng/0/cpu"].dtype == torch.uint8
    )
    assert any(k.startswith("optim/") for k in tensors)
    model = load_checkpoint(tmp_path)  # picks final
    assert model.config.n_layer == 2
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary folders left behind


def test_nan_loss_stops_and_keeps_good_checkpoint(tmp_path):
    calls = {"n": 0}
    base = WindowLMLoss()

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, info = base(model, batch)
        return (loss * float("nan") if calls["n"] > 6 else loss), info  # step 4 diverges

    with pytest.raises(TrainingDiverged, match="diverged at step 4.*step-2"):
        train(tiny_model(), loss_fn, source(), cfg(max_steps=6, save_every=2), tmp_path)
    assert [p.name for p in step_dirs(tmp_path)] == ["step-2"]
    assert not (tmp_path / "final").exists()
    good = load_checkpoint(tmp_path / "step-2")
    assert all(torch.isfinite(p).all() for p in good.parameters())


def test_gradient_checkpointing_same_losses(tmp_path):
    train(tiny_model(), WindowLMLoss(), source(), cfg(), tmp_path / "a")
    train(tiny_model(), WindowLMLoss(), source(), cfg(gradient_checkpointing=True), tmp_path / "b")
    np.testing.assert_allclose(losses(tmp_path / "a"), losses(tmp_path / "b"), rtol=1e-6)
