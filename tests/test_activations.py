"""GELU by table (`gpt1.inference.activations`): torch's bits for every bf16 number, in any
shape and at any offset, and torch's own function wherever the table does not apply."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt1 import GPT, ModelConfig
from gpt1.inference import activations, backend
from gpt1.inference.prepared import for_inference
from gpt1.model import gpt


def _kernels():
    backend.expect_decoding()
    built = backend.kernel_module()
    if built is None:
        pytest.skip("gpt1's compiled module is not built here (GPT1_MATVEC=0 or no compiler)")
    return built


def test_every_bf16_number_looks_up_torchs_gelu():
    """All 65,536 bit patterns, in an order that puts each at a different offset of the vector
    loop than the table was built at: the same bits as torch's GELU on the same tensor."""
    _kernels()
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    shuffled = every[torch.randperm(65536, generator=torch.Generator().manual_seed(0))]
    got = activations.gelu(shuffled)
    want = F.gelu(shuffled, approximate="tanh")
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    scale=st.sampled_from([1e-3, 1.0, 8.0, 1e4]),
    offset=st.integers(0, 15),
)
def test_any_shape_and_view_gives_torchs_bits(shape, scale, offset):
    """Sizes that leave a tail past the 16-lane loop, a view starting mid-vector and a
    non-contiguous one: each gives the bits of torch's vectorised GELU on the same values.
    (Torch's own last < 32 numbers of a tensor take a scalar loop, which differs from its
    vector loop at 4 bf16 inputs near -5.1, by at most 1.6e-7: the reference lays the values
    out so that all of them take the vector loop.)"""
    _kernels()
    gen = torch.Generator().manual_seed(sum(shape) + offset)
    n = 1
    for size in shape:
        n *= size
    flat = (torch.randn(n + offset, generator=gen) * scale).to(torch.bfloat16)
    x = flat[offset:].view(shape)
    for view in (x, x.transpose(0, -1)):
        values = view.contiguous().flatten()
        padded = torch.cat([values, values.new_zeros(-n % 64)])
        want = F.gelu(padded, approximate="tanh")[:n].view(view.shape)
        got = activations.gelu(view)
        assert got.shape == want.shape
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_where_the_table_does_not_apply_torchs_function_runs():
    """fp32, and bf16 that needs a gradient, go to torch's GELU (autograd keeps working)."""
    x = torch.randn(5, 7)
    assert torch.equal(activations.gelu(x), F.gelu(x, approximate="tanh"))
    leaf = torch.randn(4, 6).to(torch.bfloat16).requires_grad_()
    activations.gelu(leaf).sum().backward()
    assert leaf.grad is not None


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_a_bf16_inference_model_looks_gelu_up_and_an_fp32_one_does_not(precision):
    """`for_inference` gives bf16 and int8 (bf16 activations) CPU models the table, leaves
    fp32 models and ReLU MLPs as they were, and the forward pass keeps its bits."""
    if not backend.cpu_has_bf16():
        pytest.skip("this CPU has no bf16 instructions: int8 runs fp32 activations here")
    _kernels()
    config = ModelConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 9))
    looked = for_inference(GPT(config), "cpu", precision)
    assert all(block.mlp.activation is activations.gelu for block in looked.h)
    with torch.no_grad():
        got = looked(ids)
        for block in looked.h:
            block.mlp.activation = gpt.gelu
        want = looked(ids)
    assert torch.equal(got, want)
    plain = for_inference(GPT(config), "cpu", "fp32")
    assert all(block.mlp.activation is gpt.gelu for block in plain.h)
    relu = for_inference(GPT(config.derive(afn="relu")), "cpu", precision)
    assert all(block.mlp.activation is F.relu for block in relu.h)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    shape=st.lists(st.integers(1, 3000), min_size=1, max_size=2),
    scale=st.sampled_from([1e-3, 1.0, 8.0, 1e4]),
)
def test_the_steps_gelu_is_torchs_within_a_few_fp32_steps(shape, scale):
    """`step_gelu` of fp32 numbers of any size (pieces split over the threads, a short last
    vector) and range (tails where GELU is x or 0) lands within 1e-6 of torch's,
    and each number's result does not depend on where it lies."""
    built = _kernels()
    if not built.has_decode_step():
        pytest.skip("the decoding step is not compiled for this CPU")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))) * scale
    got = activations.step_gelu(x)
    want = F.gelu(x, approximate="tanh")
    assert got.shape == x.shape and got.dtype == torch.float32
    # Where GELU nears 0 (x near -5), torch's 1 + tanh(u) cancels to a few fp32 steps of 1 and
    # the step's x / (1 + e^(-2u)) keeps the small value: an absolute bound there.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    if x.dim() == 2:  # a transposed view: each number's result wherever it lies
        assert torch.equal(activations.step_gelu(x.t()), got.t())


def test_an_int8_model_with_fp32_activations_takes_the_steps_gelu():
    """`for_inference` gives int8 models whose activations are fp32 the step's GELU (prompts and
    classification batches then compute GELU as decoding steps do), and a gradient or a missing
    kernel sends it to torch's."""
    if backend.cpu_has_bf16():
        pytest.skip("this CPU has bf16 instructions: int8 runs bf16 activations, by table")
    built = _kernels()
    if not built.has_decode_step():
        pytest.skip("the decoding step is not compiled for this CPU")
    config = ModelConfig(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = for_inference(GPT(config), "cpu", "int8")
    assert all(block.mlp.activation is activations.step_gelu for block in model.h)
    leaf = torch.randn(4, 6).requires_grad_()
    activations.step_gelu(leaf).sum().backward()  # torch's, with its gradient
    assert leaf.grad is not None
