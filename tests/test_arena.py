"""The weights decoding streams, gathered into one storage when a model `for_inference`
prepared first decodes (`gpt1.inference.arena`): in reading order, on a huge-page boundary,
with the same values, parameter objects and results; never for a model that only classifies;
GPT1_WEIGHT_ARENA=0 leaves them where they are."""

import copy

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpt1 import GPT, ModelConfig
from gpt1.config import TaskKind
from gpt1.errors import ConfigError
from gpt1.inference import arena, backend
from gpt1.inference.decoding import prepare_to_decode
from gpt1.inference.generate import generate
from gpt1.inference.prepared import for_inference
from gpt1.inference.quantize import Int8Head
from gpt1.model.heads import FinetuneModel


def _model() -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    return GPT(config).eval()


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _decoding(precision: str, model: torch.nn.Module | None = None) -> torch.nn.Module:
    """A model `for_inference` prepared, after the preparation its first decoding step makes."""
    model = for_inference(model if model is not None else _model(), "cpu", precision)
    prepare_to_decode(model)
    return model


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_streamed_tensors_share_one_storage_in_reading_order(precision):
    model = _decoding(precision)
    tensors = [slot.tensor for slot in arena.streamed_slots(model)]
    first = tensors[0].untyped_storage()
    assert all(_storage(t) == first.data_ptr() for t in tensors)
    addresses = [t.data_ptr() for t in tensors]
    assert addresses == sorted(addresses) and len(set(addresses)) == len(addresses)
    assert addresses[0] % arena.HUGE_PAGE == 0
    assert all(a % 64 == 0 for a in addresses)
    # The output layer comes last: the token table, or the int8 head's own copy; then what
    # decoding does not stream (the position table; int8's token table, two rows a token).
    head = model.lm_head_kernel
    if isinstance(head, Int8Head):
        assert tensors[-2] is head.q and tensors[-1] is head.scale
        assert model.wte.weight.data_ptr() > head.scale.data_ptr()
    else:
        assert tensors[-1] is model.wte.weight
    for rest in (model.wte.weight, model.wpe.weight):
        assert _storage(rest) == first.data_ptr()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_gathered_model_computes_what_the_ungathered_one_does(precision, monkeypatch):
    ids = torch.randint(0, 300, (2, 12))
    prompt = torch.randint(0, 300, (1, 5))
    gathered = _decoding(precision)
    monkeypatch.setenv("GPT1_WEIGHT_ARENA", "0")
    apart = _decoding(precision)
    assert _storage(apart.h[0].attn.c_attn.bias) != _storage(apart.h[0].mlp.c_fc.bias)
    with torch.inference_mode():
        assert torch.equal(gathered.lm_logits(gathered(ids)), apart.lm_logits(apart(ids)))
        assert torch.equal(
            generate(gathered, prompt, 8, temperature=0), generate(apart, prompt, 8, temperature=0)
        )
    for (name, a), (_, b) in zip(gathered.state_dict().items(), apart.state_dict().items()):
        assert torch.equal(a, b), name


def test_parameters_keep_their_objects_and_the_int8_head_its_copy():
    model = _model()
    params = dict(model.named_parameters())
    _decoding("fp32", model)
    assert all(model.get_parameter(name) is p for name, p in params.items())
    int8 = _decoding("int8")
    head = int8.lm_head_kernel
    q = head.q
    with torch.inference_mode():
        int8.lm_logits(torch.randn(1, 64))
    assert head.q is q  # the table did not change: not quantised again outside the storage


def test_a_classifier_is_gathered_only_if_it_decodes_and_its_state_saves(tmp_path):
    torch.manual_seed(0)
    model = FinetuneModel(_model(), TaskKind.SINGLE, 3, classify_id=299)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for_inference(model, "cpu", "fp32")
    with torch.inference_mode():
        model.gpt(torch.randint(0, 300, (2, 7)))  # classifying: many rows, nothing moves
    assert _storage(model.gpt.h[0].ln_1.weight) != _storage(model.gpt.wte.weight)
    prepare_to_decode(model.gpt)  # its language model decodes (gpt1 serve, a fine-tuned run)
    assert _storage(model.gpt.h[0].ln_1.weight) == _storage(model.gpt.wte.weight)
    prepare_to_decode(model.gpt)  # once: the second step finds it gathered
    # Views of one storage that do not overlap save as separate tensors.
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    loaded = load_file(str(path))
    assert all(torch.equal(loaded[k], v) for k, v in before.items())
    twin = copy.deepcopy(model)
    assert torch.equal(twin.gpt.wte.weight, model.gpt.wte.weight)


def test_only_a_model_for_inference_prepared_is_gathered():
    model = _model()  # a model being trained decodes too (samples during a run): left alone
    prepare_to_decode(model)
    assert _storage(model.h[0].ln_1.weight) != _storage(model.wte.weight)


def test_training_after_gathering_updates_the_gathered_weights():
    model = _decoding("fp32").train()
    weight = model.h[0].mlp.c_fc.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model.lm_logits(model(torch.randint(0, 300, (1, 8)))).square().mean()
    loss.backward()
    before = weight.detach().clone()
    optimizer.step()
    assert not torch.equal(weight.detach(), before)
    assert _storage(weight) == _storage(model.wte.weight)  # updated where it lives


def test_a_misspelt_switch_is_refused_before_any_work(monkeypatch):
    monkeypatch.setenv("GPT1_WEIGHT_ARENA", "maybe")
    model = _model()
    with pytest.raises(ConfigError, match="GPT1_WEIGHT_ARENA='maybe' is not a switch"):
        for_inference(model, "cpu", "fp32")
    assert type(model.h[0].attn.c_attn) is torch.nn.Linear  # not prepacked: nothing changed
    assert _storage(model.h[0].ln_1.weight) != _storage(model.wte.weight)


def test_huge_page_mode_is_read_from_the_system():
    assert backend.huge_pages() in ("always", "madvise", "never", "unavailable")
