"""Weight-only int8 inference (`--precision int8`: gpt1.model.quantize, gpt1.model.inference):
the products equal the float products with the rounded weights, every linear layer and the tied
output layer are quantised, the model still decodes and classifies like its fp32 self, and the
refusals are one line."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpt1 import GPT, ModelConfig
from gpt1.errors import ConfigError
from gpt1.model.heads import FinetuneModel
from gpt1.model.inference import activation_dtype, for_inference
from gpt1.model.quantize import (
    MAX_RELATIVE_ERROR,
    Int8Head,
    Int8Linear,
    int8_linear,
    quantize_int8_,
    quantize_rows,
    quantized_layers,
)
from gpt1.recipes.sample import generate
from helpers.tiny import char_vocab


def _model(n_embd: int = 64) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=64, n_embd=n_embd, n_layer=2, n_head=4)
    return GPT(config).eval()


def test_quantize_rows_is_symmetric_per_channel_and_deterministic():
    torch.manual_seed(0)
    w = torch.randn(5, 32)
    w[2] = 0.0  # an all-zero row stays zero (no division by a zero scale)
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.shape == (5,)
    assert int(q.abs().max()) == 127 and bool((q[2] == 0).all())
    torch.testing.assert_close(scale[[0, 1, 3, 4]], w.abs().amax(1)[[0, 1, 3, 4]] / 127)
    # Every weight is within half a step of its int8 value.
    assert bool(((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all())
    q2, scale2 = quantize_rows(w.clone())
    assert torch.equal(q, q2) and torch.equal(scale, scale2)


@pytest.mark.parametrize("K", [32, 48, 20])  # 20: not a multiple of the kernel's block of 16
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_equals_float_product_with_rounded_weights(K, dtype):
    torch.manual_seed(0)
    w, b = torch.randn(40, K), torch.randn(40)
    q, scale = quantize_rows(w)
    dequant = q.float() * scale[:, None]
    for shape in [(1, K), (7, K), (2, 5, K), (40, K), (3, 30, K)]:  # few rows fused, many not
        x = torch.randn(shape)
        want = F.linear(x, dequant, b)
        got = int8_linear(x.to(dtype), q, scale.to(dtype), b.to(dtype))
        assert got.dtype == dtype and got.shape == want.shape
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


def test_quantize_replaces_every_linear_and_the_tied_head():
    model = _model()
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    quantize_int8_(model, torch.float32)
    assert quantized_layers(model) == n_linear == 8
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.__dict__.get("lm_head_kernel"), Int8Head)
    linear = model.h[0].mlp.c_fc
    assert isinstance(linear, Int8Linear) and not hasattr(linear, "weight")  # no float copy kept


def test_int8_model_tracks_fp32_and_head_follows_a_grown_table():
    fp32 = _model()
    int8 = quantize_int8_(_model(), torch.float32)
    ids = torch.randint(0, 300, (2, 16))
    with torch.inference_mode():
        h32, h8 = fp32(ids), int8(ids)
        rel = (h8 - h32).norm() / h32.norm()
        assert 0 < float(rel) < 0.02  # rounded, and close
        logits32, logits8 = fp32.lm_logits(h32), int8.lm_logits(h8)
        assert (logits8.argmax(-1) == logits32.argmax(-1)).float().mean() > 0.9
    # A table written after quantisation (as add_tokens does) is quantised again, not served stale.
    int8.add_tokens(3)
    with torch.inference_mode():
        assert int8.lm_logits(int8(ids)).shape[-1] == 303


def test_int8_generation_and_classification_run_through_for_inference():
    model = for_inference(_model(), "cpu", "int8")
    act = activation_dtype("int8", torch.device("cpu"))
    assert model.wte.weight.dtype == act and quantized_layers(model) == 8
    out = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=8, temperature=0.0)
    assert out.shape == (1, 11)
    torch.manual_seed(0)
    clf = FinetuneModel(_model(), "single", n_outputs=3, classify_id=299).eval()
    clf = for_inference(clf, "cpu", "int8")
    assert quantized_layers(clf) == 9  # the 8 block layers and the task head
    ids = torch.randint(0, 299, (4, 1, 10))
    ids[:, :, 9] = 299
    with torch.inference_mode():
        logits, _ = clf(ids, torch.ones(4, 1, 10), with_lm=False)
    assert logits.shape == (4, 3) and bool(torch.isfinite(logits.float()).all())


def test_int8_refusals_are_one_line_and_change_nothing():
    model = _model()
    with torch.no_grad():
        model.h[1].attn.c_proj.weight[0, 0] = 500.0  # one outlier stretches its row's scale
    before = model.h[1].attn.c_proj
    with pytest.raises(ConfigError) as err:
        quantize_int8_(model, torch.float32)
    message = str(err.value)
    assert "\n" not in message and "h.1.attn.c_proj" in message and "int8" in message
    assert f"{MAX_RELATIVE_ERROR:.0%}" in message
    assert model.h[1].attn.c_proj is before and quantized_layers(model) == 0
    with pytest.raises(ConfigError, match="CPU only"):
        activation_dtype("int8", torch.device("cuda"))
    lstm_like = nn.Sequential(nn.LSTM(8, 8))
    with pytest.raises(ConfigError, match="linear layers"):
        for_inference(lstm_like, "cpu", "int8")


def test_sample_command_takes_int8_and_refuses_it_on_a_gpu(tmp_path, capsys):
    from gpt1 import save_model
    from gpt1.cli import main

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=189, n_positions=48, n_embd=32, n_layer=2, n_head=2)
    ckpt = save_model(GPT(config), tmp_path / "ck", tokenizer_dir=char_vocab(tmp_path / "v"))
    args = ["sample", str(ckpt), "--prompt", "abc", "--max-new-tokens", "6", "--temperature", "0"]
    assert main([*args, "--precision", "int8", "--device", "cpu"]) == 0
    assert main([*args, "--precision", "int8", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("int8" in err[0] or "CUDA" in err[0])
