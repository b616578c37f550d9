"""Prepacked inference weights (`gpt1.inference.prepack.prepack_for_inference`) compute what the
plain model computes: fp32 up to summation order, bf16 to the bit, and fall back to F.linear
wherever the packed kernel does not apply (autograd, GPT1_PREPACK=0)."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpt1 import GPT, ModelConfig
from gpt1.inference.generate import generate
from gpt1.inference.prepack import (
    PackedLinear,
    PackedWeight,
    prepack_available,
    prepack_for_inference,
)
from gpt1.model.heads import FinetuneModel

needs_onednn = pytest.mark.skipif(
    not prepack_available(torch.float32), reason="this torch build has no oneDNN packed linear"
)
DTYPES = [torch.float32] + ([torch.bfloat16] if prepack_available(torch.bfloat16) else [])


@pytest.fixture(autouse=True)
def packed_everywhere(monkeypatch):
    """The packed kernel's own results, whichever product the speed check prefers on this CPU
    (`test_backend.py` tests that choice)."""
    monkeypatch.setenv("GPT1_PREPACK", "1")


def _model(vocab: int = 300) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    return GPT(config).eval()


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16:
        assert torch.equal(a, b)  # the same oneDNN bf16 kernel rounds the same way
    else:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_linear_equals_linear_for_any_row_count_and_layout(dtype):
    torch.manual_seed(0)
    plain = nn.Linear(48, 80).to(dtype)
    packed = PackedLinear.of(plain)
    assert packed.weight is plain.weight and packed.bias is plain.bias
    inputs = [
        torch.randn(1, 48),
        torch.randn(7, 48),
        torch.randn(300, 48),
        torch.randn(2, 5, 48),
        torch.randn(4, 9, 48)[:, ::2],  # strided 3-d: oneDNN misreads it unless made contiguous
        torch.randn(48, 6).t(),  # transposed 2-d
    ]
    with torch.inference_mode():
        for x in inputs:
            x = x.to(dtype)
            _close(packed(x), plain(x), dtype)
        assert packed.__dict__["_kernel"]._packed is not None  # the packed kernel did run


@needs_onednn
def test_prepack_keeps_parameters_and_state_dict_and_trains_through_f_linear():
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    packed = prepack_for_inference(copy.deepcopy(model))
    assert isinstance(packed.h[0].attn.c_attn, PackedLinear)
    assert isinstance(packed.h[1].mlp.c_proj, PackedLinear)
    after = packed.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    # With autograd on, the packed layers fall back to F.linear: the same gradients.
    ids = torch.randint(0, 300, (2, 10))
    for m in (model, packed):
        m.train()
        torch.manual_seed(1)
        m(ids).square().mean().backward()
    for (name, a), b in zip(model.named_parameters(), packed.parameters()):
        assert torch.equal(a.grad, b.grad), name


@needs_onednn
@pytest.mark.parametrize("dtype", DTYPES)
def test_prepacked_gpt_hidden_states_logits_and_greedy_text_match(dtype):
    plain = _model().to(dtype)
    packed = prepack_for_inference(copy.deepcopy(plain))
    ids = torch.randint(0, 300, (3, 20))
    lengths = torch.tensor([20, 7, 13])
    with torch.inference_mode():
        _close(packed(ids), plain(ids), dtype)
        _close(packed(ids, lengths=lengths), plain(ids, lengths=lengths), dtype)
        h = plain(ids)
        _close(packed.lm_logits(h), plain.lm_logits(h), dtype)
        assert packed.lm_head_kernel._packed is not None
        prompt = ids[:1, :5]
        assert torch.equal(
            generate(packed, prompt, 12, temperature=0), generate(plain, prompt, 12, temperature=0)
        )


@needs_onednn
def test_prepacked_classifier_outputs_match():
    gpt = _model(303)
    plain = FinetuneModel(gpt, "single", 3, classify_id=302).eval()
    packed = prepack_for_inference(copy.deepcopy(plain))
    assert isinstance(packed.head.linear, PackedLinear)
    ids = torch.randint(0, 300, (4, 1, 12))
    ids[:, 0, 11] = 302
    mask = torch.ones(4, 1, 12)
    with torch.inference_mode():
        _close(
            packed(ids, mask, with_lm=False)[0], plain(ids, mask, with_lm=False)[0], torch.float32
        )


@needs_onednn
def test_the_packed_copy_follows_weight_changes():
    """Loaded weights (in place), a dtype change and a new token table are all seen."""
    model = prepack_for_inference(_model())
    reference = _model()
    x = torch.randn(2, 64)
    with torch.inference_mode():
        model.lm_logits(x)
        model.h[0].mlp.c_fc(x)
        torch.manual_seed(3)
        other = GPT(model.config).eval()
        model.load_state_dict(other.state_dict())  # copies into the same storages
        _close(model.h[0].mlp.c_fc(x), other.h[0].mlp.c_fc(x), torch.float32)
        _close(model.lm_logits(x), other.lm_logits(x), torch.float32)
        if torch.bfloat16 in DTYPES:
            model.to(torch.bfloat16)
            reference.load_state_dict(other.state_dict())
            reference.to(torch.bfloat16)
            xb = x.bfloat16()
            _close(model.h[0].mlp.c_fc(xb), reference.h[0].mlp.c_fc(xb), torch.bfloat16)
            model.to(torch.float32)  # back: the fp32 values are bf16-rounded now, and used
            reference.to(torch.float32)
            _close(model.h[0].mlp.c_fc(x), reference.h[0].mlp.c_fc(x), torch.float32)
    model.add_tokens(2)  # a new, larger token table
    with torch.inference_mode():
        assert model.lm_logits(x).shape == (2, 302)


@needs_onednn
def test_prepacked_models_copy_and_pickle():
    model = prepack_for_inference(_model())
    x = torch.randn(3, 64)
    with torch.inference_mode():
        want = model.lm_logits(x)
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert clone.lm_head_kernel._packed is None  # packs its own copy when used
            _close(clone.lm_logits(x), want, torch.float32)


def test_gpt1_prepack_0_switches_it_off(monkeypatch):
    monkeypatch.setenv("GPT1_PREPACK", "0")
    assert not prepack_available(torch.float32)
    kernel = PackedWeight()
    w, x = torch.randn(5, 4), torch.randn(2, 4)
    with torch.inference_mode():
        assert torch.equal(kernel.linear(x, w, None), F.linear(x, w))
    assert kernel._packed is None
