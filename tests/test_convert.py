"""Weights in and out: transformers parity both ways, original OpenAI shards, bad inputs."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt1 import GPT, ModelConfig, load_checkpoint, save_model
from gpt1.errors import CheckpointError, Gpt1Error
from gpt1.recipes.convert import OPENAI_BLOCK, convert, load_openai, plan_openai, read_any

transformers = pytest.importorskip("transformers")
from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel  # noqa: E402

from helpers.tiny import ODD_SIZES_MODEL  # noqa: E402


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every parameter moved off its init: zero biases and unit LN gains, as both
    libraries initialise them, would hide a mix-up."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def tiny_hf(seed: int = 0) -> OpenAIGPTLMHeadModel:
    torch.manual_seed(seed)
    return randomized(OpenAIGPTLMHeadModel(OpenAIGPTConfig(**ODD_SIZES_MODEL)).eval())


def tiny_gpt(seed: int) -> GPT:
    torch.manual_seed(seed)
    return randomized(GPT(ModelConfig(**ODD_SIZES_MODEL)))


def ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(
        0, ODD_SIZES_MODEL["vocab_size"], (3, 17), generator=torch.Generator().manual_seed(seed)
    )


def our_logits(model: GPT, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model.lm_logits(model(x))


def test_hf_to_gpt1_logits_match(tmp_path):
    hf = tiny_hf()
    hf.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "ours", "hf", "gpt1")
    ours = load_checkpoint(tmp_path / "ours")
    x = ids()
    with torch.no_grad():
        expected = hf(x).logits
    assert torch.allclose(our_logits(ours, x), expected, atol=1e-5, rtol=0)


def test_hf_pytorch_bin_is_read_weights_only(tmp_path):
    hf = tiny_hf()
    hf.save_pretrained(tmp_path / "hf", safe_serialization=False)
    assert (tmp_path / "hf" / "pytorch_model.bin").is_file()
    model, _ = read_any(tmp_path / "hf", "hf")
    x = ids()
    with torch.no_grad():
        assert torch.allclose(our_logits(model, x), hf(x).logits, atol=1e-5, rtol=0)


def test_gpt1_to_hf_loads_with_from_pretrained(tmp_path):
    ours = tiny_gpt(3)
    save_model(ours, tmp_path / "ours")
    convert(tmp_path / "ours", tmp_path / "hf", "gpt1", "hf")
    hf = OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    x = ids(2)
    with torch.no_grad():
        assert torch.allclose(hf(x).logits, our_logits(ours, x), atol=1e-5, rtol=0)
    # and back again: bit-identical weights
    convert(tmp_path / "hf", tmp_path / "again", "hf", "gpt1")
    again = load_checkpoint(tmp_path / "again")
    for (k, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k


def test_export_carries_tokenizer_files(tmp_path):
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.json").write_text('{"a</w>": 0}')
    (vocab / "merges.txt").write_text("#version: 0.2\n")
    save_model(GPT(ModelConfig(**ODD_SIZES_MODEL)), tmp_path / "ours", tokenizer_dir=vocab)
    convert(tmp_path / "ours", tmp_path / "hf", "gpt1", "hf")
    assert (tmp_path / "hf" / "vocab.json").read_text() == '{"a</w>": 0}'
    assert (tmp_path / "hf" / "merges.txt").is_file()


# ----------------------------------------------------------------------- original shards
def oai_arrays(model: GPT) -> tuple[list[list[int]], list[np.ndarray]]:
    """The model's weights in the release's order and layout (conv weights [1, in, out])."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    arrays = [sd["wpe.weight"], sd["wte.weight"]]
    for i in range(model.config.n_layer):
        for name, kind in OPENAI_BLOCK:
            a = sd[f"h.{i}.{name}"]
            arrays.append(a.T[None] if kind == "linear" else a)
    return [list(a.shape) for a in arrays], arrays


def write_release(folder: Path, model: GPT, cuts=(0.03, 0.1, 0.11, 0.3, 0.5, 0.51, 0.7, 0.8, 0.95)):
    """Shards at arbitrary boundaries of one flat vector, as in the original release."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes, arrays = oai_arrays(model)
    flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float32)
    bounds = [0] + [int(c * len(flat)) for c in cuts] + [len(flat)]
    for i in range(10):
        np.save(folder / f"params_{i}.npy", flat[bounds[i] : bounds[i + 1]])
    (folder / "params_shapes.json").write_text(json.dumps(shapes))
    return shapes, arrays


# A block's arrays in the release, in order: written out here, not read from gpt1's own table.
RELEASE_BLOCK_ORDER = [
    f"{layer}.{param}"
    for layer in ("attn.c_attn", "attn.c_proj", "ln_1", "mlp.c_fc", "mlp.c_proj", "ln_2")
    for param in ("weight", "bias")
]


def hf_from_oai_arrays(arrays, config: ModelConfig) -> OpenAIGPTLMHeadModel:
    """An HF model filled directly from the release arrays (Conv1D keeps [in, out])."""
    hf = OpenAIGPTLMHeadModel(
        OpenAIGPTConfig(
            vocab_size=config.vocab_size,
            n_positions=config.n_positions,
            n_embd=config.n_embd,
            n_layer=config.n_layer,
            n_head=config.n_head,
        )
    ).eval()
    tr = hf.transformer
    params = [tr.positions_embed.weight, tr.tokens_embed.weight]
    for block in tr.h:
        params += [block.get_parameter(name) for name in RELEASE_BLOCK_ORDER]
    with torch.no_grad():
        for p, a in zip(params, arrays):
            p.copy_(torch.from_numpy(a.reshape(p.shape)))
    return hf


def test_openai_shards_load_and_match_hf(tmp_path):
    source = tiny_gpt(5)
    _, arrays = write_release(tmp_path / "model", source)
    convert(
        tmp_path / "model", tmp_path / "ours", "openai", "gpt1", n_head=ODD_SIZES_MODEL["n_head"]
    )
    ours = load_checkpoint(tmp_path / "ours")
    assert ours.config.n_layer == 2 and ours.config.vocab_size == 101
    hf = hf_from_oai_arrays(arrays, ours.config)
    x = ids(4)
    with torch.no_grad():
        assert torch.allclose(our_logits(ours, x), hf(x).logits, atol=1e-5, rtol=0)


def test_openai_vocab_files_are_carried(tmp_path):
    write_release(tmp_path / "model", GPT(ModelConfig(**ODD_SIZES_MODEL)))
    (tmp_path / "model" / "encoder_bpe_40000.json").write_text('{"x</w>": 0}')
    (tmp_path / "model" / "vocab_40000.bpe").write_text("#version: 0.2\n")
    convert(tmp_path / "model", tmp_path / "ours", "openai", "gpt1", n_head=4)
    assert (tmp_path / "ours" / "vocab.json").read_text() == '{"x</w>": 0}'
    assert (tmp_path / "ours" / "merges.txt").read_text() == "#version: 0.2\n"


def test_full_size_release_shapes(shared_data):
    """The real params_shapes.json maps onto the gpt1 preset, checked on the meta device."""
    shapes = json.loads((shared_data / "gpt1_tokenizer" / "params_shapes.json").read_text())
    assert len(shapes) == 146
    config, plan = plan_openai(shapes, n_head=12)
    assert (
        config.vocab_size,
        config.n_positions,
        config.n_embd,
        config.n_layer,
        config.n_inner,
    ) == (40478, 512, 768, 12, 3072)
    assert sum(int(np.prod(s)) for _, s in plan) == 116_534_784
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in GPT(config).state_dict().items()}
    names = [n for n, _ in plan]
    assert len(names) == len(set(names)) and set(names) == set(expected)  # each parameter once
    for name, stored in plan:
        want = expected[name]
        assert stored == ((1, want[1], want[0]) if len(stored) == 3 else want), name


# ------------------------------------------------------------------------------ bad input
def test_missing_shard(tmp_path):
    write_release(tmp_path / "m", GPT(ModelConfig(**ODD_SIZES_MODEL)))
    (tmp_path / "m" / "params_7.npy").unlink()
    with pytest.raises(CheckpointError, match=r"params_7\.npy: missing shard"):
        load_openai(tmp_path / "m", n_head=4)


def test_truncated_shard(tmp_path):
    write_release(tmp_path / "m", GPT(ModelConfig(**ODD_SIZES_MODEL)))
    f = tmp_path / "m" / "params_3.npy"
    f.write_bytes(f.read_bytes()[:-40])
    with pytest.raises(CheckpointError, match=r"params_3\.npy: unreadable or truncated"):
        load_openai(tmp_path / "m", n_head=4)


def test_shard_too_short_overall(tmp_path):
    write_release(tmp_path / "m", GPT(ModelConfig(**ODD_SIZES_MODEL)))
    np.save(
        tmp_path / "m" / "params_9.npy", np.zeros(3, dtype=np.float32)
    )  # a valid but short file
    with pytest.raises(CheckpointError, match="shards hold .* floats but params_shapes.json needs"):
        load_openai(tmp_path / "m", n_head=4)


def test_shape_mismatch(tmp_path):
    write_release(tmp_path / "m", GPT(ModelConfig(**ODD_SIZES_MODEL)))
    shapes = json.loads((tmp_path / "m" / "params_shapes.json").read_text())
    shapes[2 + 12 + 6] = [1, 32, 100]  # block 1 mlp.c_fc
    (tmp_path / "m" / "params_shapes.json").write_text(json.dumps(shapes))
    with pytest.raises(CheckpointError, match=r"params_shapes.json: array 20 \(h\.1\.mlp\.c_fc"):
        load_openai(tmp_path / "m", n_head=4)


def test_unknown_config_keys(tmp_path):
    save_model(GPT(ModelConfig(**ODD_SIZES_MODEL)), tmp_path / "ours")
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    cfg["model"]["n_ctx_typo"] = 5
    (tmp_path / "ours" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"config.json: unknown key\(s\) n_ctx_typo"):
        convert(tmp_path / "ours", tmp_path / "hf", "gpt1", "hf")


def test_pickle_where_safetensors_expected(tmp_path):
    hf = tiny_hf()
    hf.save_pretrained(tmp_path / "hf")
    torch.save(hf.state_dict(), tmp_path / "hf" / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: this is a pickle"):
        convert(tmp_path / "hf", tmp_path / "ours", "hf", "gpt1")


def test_hf_wrong_shapes_named(tmp_path):
    hf = tiny_hf()
    hf.save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["n_positions"] = 48
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError, match=r"'wpe.weight' has shape \(24, 32\), expected \(48, 32\)"
    ):
        read_any(tmp_path / "hf", "hf")


def test_hub_name_offline_is_one_line_error(tmp_path, monkeypatch):
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Gpt1Error, match="openai-community/openai-gpt: not a local folder") as err:
        convert("openai-community/openai-gpt", tmp_path / "out", "hf", "gpt1")
    assert "\n" not in str(err.value)
