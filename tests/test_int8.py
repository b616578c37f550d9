"""Weight-only int8 inference (`--precision int8`: gpt1.inference.quantize, gpt1.inference.prepared):
the products equal the float products with the rounded weights, every linear layer and the tied
output layer are quantised, the model still decodes and classifies like its fp32 self, and the
refusals are one line."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpt1 import GPT, ModelConfig
from gpt1.errors import ConfigError
from gpt1.inference import backend, kernel_build, quantize
from gpt1.inference.generate import generate
from gpt1.inference.prepared import activation_dtype, for_inference
from gpt1.inference.quantize import (
    MAX_RELATIVE_ERROR,
    Int8Head,
    Int8Linear,
    PackedInt8,
    int8_linear,
    quantize_int8_,
    quantize_rows,
    quantized_layers,
)
from gpt1.model.heads import FinetuneModel
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
    capsys.readouterr()  # the first command's output, its threads line among it
    assert main([*args, "--precision", "int8", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("int8" in err[0] or "CUDA" in err[0])


# ------------------------------------------------------------------ many rows: oneDNN's int8 kernel
needs_onednn_int8 = pytest.mark.skipif(
    not backend.onednn_has_int8(), reason="this torch build has no oneDNN int8 linear kernel"
)


@pytest.fixture(autouse=True)
def int8_kernel_on(monkeypatch):
    """The many-row tests check oneDNN's int8 product itself, whether or not the backend would
    take it on this CPU (where it is slower than the float path, it does not)."""
    monkeypatch.setenv("GPT1_INT8_MATMUL", "1")


def _compiled_quantizer() -> bool:
    built = backend.kernel_module()
    return built is not None and built.has_quantize_per_tensor()


def _per_tensor_reference(x, q, scale, bias):
    """The many-row path's maths written out: x rounded to int8 with one scale (its largest
    magnitude to 127; the scaled value is in fp32 where gpt1's compiled pass quantises, in x's
    dtype where torch's operators do, before it is rounded), times the int8 weight, both scales
    and the bias applied, in fp64."""
    amax = float(x.abs().max())
    scaled = x.float() * (127.0 / amax)
    qx = torch.round((scaled if _compiled_quantizer() else scaled.to(x.dtype)).double())
    assert float(qx.abs().max()) == 127
    out = F.linear(qx, q.double()) * (amax / 127.0 * scale.double())
    return out if bias is None else out + bias.double()


@needs_onednn_int8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("encoding", ["s8", "u8"])
def test_many_rows_run_the_int8_kernel_with_per_tensor_activations(
    dtype, with_bias, encoding, monkeypatch
):
    """Signed activations, and unsigned ones with zero point 128 (the same integers): the same
    product, whichever the backend takes on this CPU."""
    if not backend.onednn_int8_exact(encoding):
        pytest.skip("oneDNN's int8 sums saturate on this CPU: gpt1's own kernel takes these rows")
    monkeypatch.setattr(backend, "int8_many_rows", lambda: encoding)
    torch.manual_seed(0)
    w = torch.randn(48, 40) * 0.05
    q, scale = quantize_rows(w)
    b = (torch.randn(48) * 0.1).to(dtype) if with_bias else None
    packed = PackedInt8()
    float_path = quantize._dequantised_linear
    monkeypatch.setattr(quantize, "_dequantised_linear", _refuse)
    # Many rows, flat and batched, and a transposed (strided) input.
    for x in [torch.randn(40, 40), torch.randn(3, 30, 40), torch.randn(40, 40).t()]:
        x = x.to(dtype)
        got = int8_linear(x, q, scale, b, packed)
        assert got.dtype == dtype and got.shape == (*x.shape[:-1], 48)
        # Exactly the int8 product (fp32 up to summation order; bf16: one rounding of the output).
        want = _per_tensor_reference(x, q, scale, b)
        tol = 1e-5 if dtype == torch.float32 else 8e-3
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max())
        # Within 2% (norm of the difference over the norm) of the product with float activations.
        exact = F.linear(x.double(), q.double() * scale.double()[:, None])
        exact = exact if b is None else exact + b.double()
        assert float((got.double() - exact).norm() / exact.norm()) < 0.02
        assert float((float_path(x, q, scale, b).double() - exact).norm() / exact.norm()) < 0.02


def _refuse(*args, **kwargs):
    raise AssertionError("the float path ran")


@needs_onednn_int8
def test_few_rows_and_autograd_keep_their_paths(monkeypatch):
    torch.manual_seed(0)
    q, scale = quantize_rows(torch.randn(48, 32))
    packed = PackedInt8()
    monkeypatch.setattr(PackedInt8, "packed", _refuse)
    x = torch.randn(2, 32)  # decoding: the few-row kernel
    torch.testing.assert_close(
        int8_linear(x, q, scale, None, packed), F.linear(x, q * scale[:, None])
    )
    x = torch.randn(40, 32, requires_grad=True)  # autograd: the float product
    out = int8_linear(x, q, scale, None, packed)
    out.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(out, quantize._dequantised_linear(x, q, scale, None))


@pytest.mark.parametrize("how", ["missing", "switched off", "slower", "fails"])
def test_many_rows_fall_back_to_the_float_path(how, monkeypatch):
    torch.manual_seed(0)
    q, scale = quantize_rows(torch.randn(48, 32))
    x, b = torch.randn(40, 32), torch.randn(48)
    monkeypatch.setattr(backend, "_failures", {})  # a failure here stays in this test
    if how == "missing":
        monkeypatch.setattr(backend, "onednn_has_int8", lambda: False)
    elif how == "switched off":
        monkeypatch.setenv("GPT1_INT8_MATMUL", "0")
    elif how == "slower":  # than the float path, on a CPU where its sums are exact
        monkeypatch.delenv("GPT1_INT8_MATMUL", raising=False)
        monkeypatch.setattr(backend, "onednn_int8_exact", lambda encoding: True)
        monkeypatch.setattr(
            backend, "int8_probe", lambda: backend.Int8Probe(1e-3, 1.0, 2e-3, 9e9, 9e9)
        )
    else:  # oneDNN's kernel taken (as where its sums are exact), and failing
        monkeypatch.setattr(backend, "onednn_has_int8", lambda: True)
        monkeypatch.setattr(backend, "onednn_int8_exact", lambda encoding: True)
        monkeypatch.setattr(torch.ops.onednn, "qlinear_pointwise", _unsupported, raising=False)
    want = quantize._dequantised_linear(x, q, scale, b)
    if how == "fails":
        with pytest.warns(RuntimeWarning, match="int8 matrix product failed"):
            got = int8_linear(x, q, scale, b, PackedInt8())
        # Not tried again in this process.
        monkeypatch.setattr(torch.ops.onednn, "qlinear_pointwise", _refuse, raising=False)
        assert torch.equal(int8_linear(x, q, scale, b, PackedInt8()), want)
    else:
        got = int8_linear(x, q, scale, b, PackedInt8())
    assert torch.equal(got, want)


@needs_onednn_int8
def test_activations_with_no_scale_take_the_float_path():
    torch.manual_seed(0)
    q, scale = quantize_rows(torch.randn(48, 32))
    b = torch.randn(48)
    x = torch.randn(40, 32)
    x[3, 5] = float("inf")  # propagates as in the float product, not quantised to garbage
    got = int8_linear(x, q, scale, b, PackedInt8())
    assert torch.equal(got, quantize._dequantised_linear(x, q, scale, b))
    assert bool(torch.isinf(got[3]).any()) and bool(torch.isfinite(got[4]).all())
    zeros = torch.zeros(40, 32)  # no magnitude to scale by: bias only
    assert torch.equal(int8_linear(zeros, q, scale, b, PackedInt8()), b.expand(40, 48))


def _unsupported(*args, **kwargs):
    raise RuntimeError("onednn qlinear: unsupported on this CPU\nmore detail")


@needs_onednn_int8
def test_packed_copy_is_remade_after_the_weight_changes():
    torch.manual_seed(0)
    lin = Int8Linear(nn.Linear(32, 48), torch.float32)
    x = torch.randn(40, 32)
    with torch.no_grad():
        first = lin(x)
        packed = lin._packed._copy
        assert lin(x) is not None and lin._packed._copy is packed  # kept while unchanged
        lin.qweight.neg_()  # in place
        torch.testing.assert_close(lin(x), 2 * lin.bias - first, rtol=1e-5, atol=1e-5)
        lin.qweight = torch.zeros_like(lin.qweight)  # replaced
        torch.testing.assert_close(lin(x), lin.bias.expand(40, 48))


@needs_onednn_int8
def test_int8_model_with_packed_copies_deepcopies_and_pickles():
    model = quantize_int8_(_model(), torch.float32)
    ids = torch.randint(0, 300, (4, 16))
    with torch.inference_mode():
        want = model.lm_logits(model(ids))  # packs every layer and the head
    packed = model.h[0].mlp.c_fc._packed  # oneDNN's copy, or gpt1's kernel's where it saturates
    if not backend.onednn_int8_saturates() or backend.few_rows_int8():  # else the float path
        assert packed._copy is not None or packed._few_rows is not None
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        made = copied.h[0].mlp.c_fc._packed
        assert made._copy is None and made._few_rows is None  # packs its own on first use
        with torch.inference_mode():
            torch.testing.assert_close(copied.lm_logits(copied(ids)), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(800, 3072), (7, 20), (1, 1)])
def test_the_compiled_quantiser_rounds_as_torch_does(dtype, shape, monkeypatch):
    """gpt1's two-pass quantiser (C++) against the four torch operators it replaces: the same
    scale, and integers equal to round-half-even of x * 127 / amax computed in fp32 (torch's
    own path scales in x's dtype: for bf16 a value may land one level away)."""
    if not _compiled_quantizer():
        pytest.skip("gpt1's compiled quantiser is built for AVX-512 or AVX2 CPUs only")
    torch.manual_seed(0)
    x = (torch.randn(shape) * 3).to(dtype)
    got, got_scale = quantize._quantize_per_tensor(x)
    amax = float(x.abs().max())
    want = torch.round(x.float() * torch.tensor(127.0 / amax, dtype=torch.float32))
    assert got.dtype == torch.int8 and got.shape == x.shape and got.is_contiguous()
    assert got_scale == amax / 127.0
    assert torch.equal(got.float(), want) and int(got.abs().max()) == 127
    monkeypatch.setattr(kernel_build, "module", lambda: None)  # torch's operators
    theirs, their_scale = quantize._quantize_per_tensor(x)
    assert their_scale == got_scale
    assert int((theirs.int() - got.int()).abs().max()) <= (0 if dtype == torch.float32 else 1)
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y.view(-1)[0] = bad
        assert quantize._quantize_per_tensor(y) == (None, 0.0)
    assert quantize._quantize_per_tensor(torch.zeros(shape, dtype=dtype)) == (None, 0.0)
