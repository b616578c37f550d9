"""The decoding kernel (`gpt1.inference.matvec`, in the module `gpt1.inference.kernel_build` builds on first use): its products equal
`F.linear`'s for int8 (with scales), bf16 and fp32 weights, every row count it takes and sizes
that are not multiples of its blocks; the model paths that use it decode as they do without it;
and where it cannot be built, one warning and torch's kernels take over."""

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F

from gpt1 import GPT, ModelConfig
from gpt1.errors import ConfigError
from gpt1.inference import backend, kernel_build, matvec
from gpt1.inference.generate import generate
from gpt1.inference.prepared import for_inference
from gpt1.inference.quantize import int8_linear, quantize_rows


@pytest.fixture(scope="module")
def op():
    built = backend.kernel()
    if built is None:
        pytest.skip("the decoding kernel is not built (gpt1 kernels build) or cannot be here")
    return built


def _weights(dtype: torch.dtype, N: int, K: int):
    if dtype == torch.int8:
        return quantize_rows(torch.randn(N, K))
    return torch.randn(N, K).to(dtype), None


@pytest.mark.parametrize("dtype", matvec.DTYPES)
@pytest.mark.parametrize(
    "K,N", [(64, 40), (20, 7), (3072, 33), (37, 1)]
)  # tails of 16, of 8 and of 4
def test_kernel_equals_float_linear_for_every_row_count(op, dtype, K, N):
    torch.manual_seed(0)
    w, scale = _weights(dtype, N, K)
    dense = w.double() * (scale.double()[:, None] if scale is not None else 1.0)
    for M in range(1, matvec.MAX_ROWS + 1):
        for x_dtype in (torch.float32, torch.bfloat16):
            x, bias = torch.randn(M, K).to(x_dtype), torch.randn(N)
            want = F.linear(x.double(), dense, bias.double())
            got = op(x, w, scale, bias)
            assert got.dtype == x_dtype and got.shape == (M, N)
            # fp32 accumulation: a few ulps of the output's scale; bf16 output: its rounding.
            tol = 1e-5 if x_dtype == torch.float32 else 8e-3
            torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * want.abs().max())
            no_bias = op(x, w, scale, None)
            torch.testing.assert_close(
                no_bias.double(), want - bias.double(), rtol=tol, atol=tol * want.abs().max()
            )


@contextlib.contextmanager
def _one_row_reads(stream: bool):
    """The kernel's one-row reading of fp32 weights and bf16 pairs set to `stream` for the
    block, then put back as it was."""
    module = backend.kernel_module()
    before = [module.set_one_row_stream(pairs, stream) for pairs in (False, True)]
    try:
        yield module
    finally:
        for pairs, was in zip((False, True), before):
            module.set_one_row_stream(pairs, was)


@pytest.mark.parametrize("dtype", matvec.DTYPES)
@pytest.mark.parametrize("K,N", [(64, 40), (20, 7), (3072, 33), (37, 1)])
@pytest.mark.parametrize("stream", [True, False])
def test_a_rows_product_is_the_same_bits_alone_and_beside_others(op, dtype, K, N, stream):
    """One row may read the weights another way than several (a channel at a time, for fp32
    weights and bf16 pairs, where `backend` timed that faster) but sums in the same order: a
    sequence decodes to the same bits whichever sequences share its step, either way."""
    with _one_row_reads(stream):
        torch.manual_seed(1)
        w, scale = _weights(dtype, N, K)
        for x_dtype in (torch.float32, torch.bfloat16):
            x, bias = torch.randn(matvec.MAX_ROWS, K).to(x_dtype), torch.randn(N)
            alone = torch.cat([op(x[m : m + 1], w, scale, bias) for m in range(len(x))])
            for M in range(2, matvec.MAX_ROWS + 1):
                assert torch.equal(op(x[:M], w, scale, bias), alone[:M])


def test_one_row_reads_as_its_timing_found_faster(op, monkeypatch):
    """Each dtype's one-row reading is the one its record timed faster (unmeasured: a channel
    at a time), set on the module when it is first used."""
    probe = backend.OneRowProbe({"float32": [2.0, 1.0], "bfloat16": [1.0, 2.0]})
    with _one_row_reads(True) as module:
        monkeypatch.setattr(backend.timings, "kept", lambda name, kind, measure, again=False: probe)
        monkeypatch.setattr(backend, "_one_row_read", set())  # the module not yet set
        backend.kernel_module()
        assert module.set_one_row_stream(False, True) is False  # fp32: side by side was faster
        assert module.set_one_row_stream(True, True) is True  # bf16 pairs: the stream was
        assert backend.OneRowProbe({}).stream("float32")


def test_kernel_refuses_what_it_cannot_take(op):
    x, w = torch.randn(1, 16), torch.randn(4, 16)
    for bad in [
        lambda: op(torch.randn(9, 16), w, None, None),  # more rows than it keeps in registers
        lambda: op(x, torch.randn(4, 15), None, None),  # shapes
        lambda: op(x, torch.zeros(4, 16, dtype=torch.int8), None, None),  # int8 without scales
        lambda: op(x, w.double(), None, None),  # a weight type it does not read
        lambda: op(x, w.t().contiguous().t(), None, None),  # not contiguous
    ]:
        with pytest.raises(RuntimeError, match="matvec"):
            bad()


def test_applies_only_to_a_few_rows_without_autograd():
    w = torch.randn(8, 16)
    assert matvec.applies(torch.randn(1, 16), w)
    assert matvec.applies(torch.randn(2, 4, 16), w)  # 8 rows in all
    assert not matvec.applies(torch.randn(9, 16), w)
    assert not matvec.applies(torch.randn(0, 16), w)
    assert not matvec.applies(torch.randn(1, 16), w.requires_grad_())
    with torch.no_grad():
        assert matvec.applies(torch.randn(1, 16), w)
    assert not matvec.applies(torch.randn(1, 16), torch.randn(8, 16).double())


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_decoding_with_the_kernel_equals_decoding_without_it(op, precision, monkeypatch):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    model = for_inference(GPT(config), "cpu", precision)
    ids = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        logits = model.lm_logits(model(ids)[:, -1:])
    with_kernel = generate(model, ids, 24, temperature=0)
    monkeypatch.setattr(backend, "few_rows_kernel", lambda: None)
    with torch.no_grad():
        logits_torch = model.lm_logits(model(ids)[:, -1:])
    without = generate(model, ids, 24, temperature=0)
    # One row (the last position's logits) goes through the kernel or torch's: the same up to
    # summation order; and the greedy tokens are the same.
    tol = 1e-5 if precision == "fp32" else 2e-2
    torch.testing.assert_close(logits.float(), logits_torch.float(), rtol=tol, atol=tol)
    assert torch.equal(with_kernel, without)


def test_int8_linear_takes_the_kernel_and_torchs_kernel_alike(op, monkeypatch):
    torch.manual_seed(0)
    q, scale = quantize_rows(torch.randn(48, 64))
    x, bias = torch.randn(3, 64).bfloat16(), torch.randn(48).bfloat16()
    ours = int8_linear(x, q, scale, bias)
    monkeypatch.setattr(backend, "few_rows_kernel", lambda: None)
    theirs = int8_linear(x, q, scale, bias)  # torch's _weight_int8pack_mm
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)


def test_a_kernel_that_cannot_be_built_warns_once_and_torch_takes_over(monkeypatch, tmp_path):
    def no_compiler(folder, name):
        raise RuntimeError("Ninja is required to load C++ extensions\nmore detail")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("GPT1_MATVEC", raising=False)
    monkeypatch.setattr(kernel_build, "_compile", no_compiler)
    backend.reset()
    try:
        with pytest.warns(RuntimeWarning, match="could not build its decoding kernel.*Ninja"):
            assert backend.kernel() is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the answer is kept: no second warning
            assert backend.kernel() is None
            q, scale = quantize_rows(torch.randn(32, 32))
            x = torch.randn(1, 32)
            torch.testing.assert_close(
                int8_linear(x, q, scale, None),
                F.linear(x, q.float() * scale[:, None]),
                rtol=1e-4,
                atol=1e-4,
            )
        backend.reset()
        for off in ["torch", "0", "off", "FALSE"]:  # chosen, not failed: nothing built, no warning
            monkeypatch.setenv("GPT1_MATVEC", off)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert backend.kernel() is None
    finally:
        backend.reset()  # the next caller finds the real build


def test_the_build_target_is_part_of_the_build_name_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.delenv(kernel_build.MARCH_VARIABLE, raising=False)
    native = kernel_build.build_name()
    assert kernel_build.build_target() == "native"
    monkeypatch.setenv(kernel_build.MARCH_VARIABLE, "x86-64-v3")
    assert "-march=x86-64-v3" in kernel_build._cflags()
    assert kernel_build.build_name() != native  # an AVX2 build never replaces the native one
    monkeypatch.setenv(kernel_build.MARCH_VARIABLE, "native; rm -rf /")
    with pytest.raises(ConfigError, match="GPT1_KERNEL_MARCH"):
        kernel_build.build_target()


def test_the_step_and_the_quantiser_are_built_for_avx2_as_for_avx512(op):
    """The one-call decoding step and the quantiser are compiled for every CPU with AVX2 and FMA,
    not only for AVX-512 ones. Run with `GPT1_KERNEL_MARCH=x86-64-v3` on an AVX-512 host to check
    the AVX2 build (the other tests of this file and of test_block_step.py then run it too)."""
    avx2 = kernel_build.build_target() == "x86-64-v3" or (
        kernel_build.build_target() == "native"
        and {"avx2", "fma"} <= set(kernel_build.cpu_flags().split())
    )
    if not avx2:
        pytest.skip("neither this CPU nor the build target has AVX2 and FMA")
    built = backend.kernel_module()
    assert built.has_decode_step()
    assert built.has_quantize_per_tensor()
