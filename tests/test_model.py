"""The model is exactly GPT-1: shapes, causality, parameter count, init, dropout, task tokens."""

import json

import pytest
import torch
from conftest import check_causal, check_shapes_and_tied_head, tiny_model_config

from gpt1 import GPT, ModelConfig, load_checkpoint, model_preset, save_model
from gpt1.errors import CheckpointError, ConfigError
from gpt1.model.gpt import parameter_count
from gpt1.train.parallelize import checkpoint_blocks, is_checkpointed

tiny = tiny_model_config


def test_config_derives_the_inner_width_and_head_size():
    c = ModelConfig(vocab_size=8192, n_positions=256, n_embd=384, n_layer=6, n_head=6)
    assert c.n_inner == 1536 and c.head_dim == 64


def test_paper_parameter_count_without_allocating():
    assert parameter_count(model_preset("gpt1")) == 116_534_784
    assert parameter_count(model_preset("gpt1"), exclude_embeddings=True) == 85_054_464


def test_paper_parameter_count_allocated():
    with torch.device("meta"):
        model = GPT(model_preset("gpt1"))
    assert model.num_parameters() == 116_534_784


def test_shapes_and_tied_head():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    check_shapes_and_tied_head(model, vocab_size=97, n_embd=32)


def test_post_ln_block_matches_formula():
    torch.manual_seed(0)
    model = GPT(tiny(n_layer=1)).eval()
    ids = torch.randint(0, 97, (2, 7))
    x = model.wte(ids) + model.wpe(torch.arange(7))
    b = model.h[0]
    B, T, C = x.shape
    q, k, v = b.attn.c_attn(x).split(C, dim=-1)
    heads = lambda t: t.view(B, T, 4, 8).transpose(1, 2)
    w = heads(q) @ heads(k).transpose(-1, -2) / 8**0.5
    mask = torch.tril(torch.ones(T, T))
    w = w * mask - 1e9 * (1 - mask)  # OAI's multiplicative mask
    a = (w.softmax(-1) @ heads(v)).transpose(1, 2).reshape(B, T, C)
    n = b.ln_1(x + b.attn.c_proj(a))
    h = b.mlp.c_fc(n)
    h = 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h**3)))
    expected = b.ln_2(n + b.mlp.c_proj(h))
    torch.testing.assert_close(model(ids), expected, atol=1e-5, rtol=1e-5)


def test_causality():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    ids = torch.randint(0, 97, (2, 16))
    changed = ids.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 97
    check_causal(model, ids, changed, 9)


def test_lengths_skip_right_padding_exactly():
    # Real positions get the padded batch's states; the padding comes back as zeros.
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    ids = torch.randint(0, 97, (4, 12))
    lengths = torch.tensor([12, 5, 1, 0])
    full, unpadded = model(ids), model(ids, lengths=lengths)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(unpadded[b, :n], full[b, :n], rtol=1e-5, atol=1e-5)
        assert not unpadded[b, n:].any()
    # No padding at all: the plain path, bit for bit.
    assert torch.equal(model(ids, lengths=torch.full((4,), 12)), full)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("embd_dropout", ["sum", "matrix"])
def test_lengths_give_the_padded_gradients(checkpointing, embd_dropout):
    # Train mode without dropout: the loss on real positions has the same gradients either way.
    torch.manual_seed(0)
    model = GPT(
        tiny(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0, embd_dropout=embd_dropout)
    ).train()
    if checkpointing:
        assert checkpoint_blocks(model) == 2 and is_checkpointed(model)
    ids = torch.randint(0, 97, (3, 9))
    lengths = torch.tensor([9, 4, 6])
    real = (torch.arange(9) < lengths[:, None]).float()[..., None]  # [B, T, 1]
    grads = []
    for kwargs in ({}, {"lengths": lengths}):
        model.zero_grad()
        hidden = model(ids, **kwargs)
        (model.lm_logits(hidden * real).logsumexp(-1) * real[..., 0]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-5, msg=name)


def test_lengths_are_checked():
    model = GPT(tiny()).eval()
    ids = torch.zeros(2, 5, dtype=torch.long)
    for bad in (torch.tensor([5]), torch.tensor([6, 1]), torch.tensor([-1, 2])):
        with pytest.raises(ValueError, match="lengths"):
            model(ids, lengths=bad)


def test_init_statistics():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=2000, n_positions=128, n_embd=128, n_layer=2, n_head=4))
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        elif "ln_" in name:
            assert torch.all(p == 1), name
        else:
            assert abs(p.std().item() - 0.02) < 0.002, name
            assert abs(p.mean().item()) < 0.002, name


def test_dropout_active_in_train_off_in_eval():
    torch.manual_seed(0)
    model = GPT(tiny())
    ids = torch.randint(0, 97, (2, 8))
    model.train()
    assert not torch.equal(model(ids), model(ids))
    model.eval()
    assert torch.equal(model(ids), model(ids))


def test_matrix_embedding_dropout_ties_head():
    torch.manual_seed(0)
    model = GPT(tiny(embd_dropout="matrix")).train()
    ids = torch.randint(0, 97, (2, 8))
    hidden, w = model(ids, with_head_weight=True)
    assert not torch.equal(w, model.wte.weight)
    frac_zero = (w == 0).float().mean().item()
    assert 0.05 < frac_zero < 0.15
    # Nothing from the pass is kept on the model: the dropped table travels with the output.
    assert not [k for k, v in vars(model).items() if isinstance(v, torch.Tensor)]
    assert torch.equal(model.lm_weight(), model.wte.weight)
    model.eval()
    assert model(ids, with_head_weight=True).head_weight is model.wte.weight


def test_add_task_tokens_extends_tied_head():
    torch.manual_seed(0)
    model = GPT(tiny(vocab_size=500, n_embd=64))
    old = model.wte.weight.detach().clone()
    ids = model.add_tokens(3)
    assert ids == [500, 501, 502] and model.config.vocab_size == 503
    assert torch.equal(model.wte.weight[:500], old)
    new = model.wte.weight[500:]
    assert 0.005 < new.std().item() < 0.05
    logits = model.lm_logits(model.eval()(torch.tensor([[1, 501, 502]])))
    assert logits.shape[-1] == 503


def test_too_long_sequence_is_an_error():
    model = GPT(tiny())
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_bad_config_values():
    with pytest.raises(ConfigError):
        ModelConfig(n_embd=100, n_head=3)
    with pytest.raises(ConfigError, match="unknown key"):
        ModelConfig.from_dict({"n_embd": 64, "n_heads": 2})


def test_checkpoint_roundtrip(tmp_path):
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    save_model(model, tmp_path / "ckpt")
    loaded = load_checkpoint(tmp_path / "ckpt").eval()
    ids = torch.randint(0, 97, (2, 8))
    torch.testing.assert_close(model(ids), loaded(ids))
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temp folders left


def test_checkpoint_refuses_pickle(tmp_path):
    model = GPT(tiny())
    save_model(model, tmp_path / "ckpt")
    torch.save(model.state_dict(), tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(CheckpointError, match="pickle"):
        load_checkpoint(tmp_path / "ckpt")


def test_checkpoint_shape_mismatch(tmp_path):
    save_model(GPT(tiny()), tmp_path / "ckpt")
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    cfg["model"]["n_embd"] = 64
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(tmp_path / "ckpt")


def test_checkpoint_truncated(tmp_path):
    save_model(GPT(tiny()), tmp_path / "ckpt")
    f = tmp_path / "ckpt" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:500])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(tmp_path / "ckpt")


def test_forward_at_one_position_per_row_equals_the_full_forward(tiny_config):
    """`at=` (the last block only at the given positions) gives the full pass's states there,
    padded or not; a classifier's outputs through it equal the head on the full states."""
    from gpt1.model.heads import FinetuneModel, extract_states

    torch.manual_seed(0)
    model = GPT(tiny_config(vocab_size=100)).eval()
    ids = torch.randint(0, 100, (3, 12))
    at = torch.tensor([11, 0, 6])
    rows = torch.arange(3)
    lengths = torch.tensor([12, 3, 7])
    with torch.no_grad():
        torch.testing.assert_close(model(ids, at=at), model(ids)[rows, at], rtol=1e-5, atol=1e-5)
        padded = model(ids, lengths=lengths, at=lengths - 1)
        full = model(ids, lengths=lengths)[rows, lengths - 1]
        torch.testing.assert_close(padded, full, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError):
            model(ids, at=torch.tensor([12, 0, 0]))
        clf = FinetuneModel(model, "pair", 3, classify_id=99).eval()
        x = torch.randint(0, 99, (2, 1, 10))
        x[0, 0, 9], x[1, 0, 5] = 99, 99
        mask = torch.ones(2, 1, 10)
        mask[1, 0, 6:] = 0
        out, lm = clf(x, mask, with_lm=False)
        hidden = model(x[:, 0], lengths=mask[:, 0].sum(1).long())
        want = clf.head(extract_states(hidden, x[:, 0], 99)[:, None])
    assert lm is None
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attn_pdrop", [0.1, 0.37])  # an exact-fraction rate and torch's sampler
@pytest.mark.parametrize("padded", [False, True])
def test_forward_at_in_training_applies_the_full_passes_attention_dropout(
    tiny_config, attn_pdrop, padded
):
    """In training, a classifier without the auxiliary LM (`with_lm=False`, the `at=` path) gets
    the attention dropout of the full pass: with the same seed, the same outputs and gradients
    (only attention dropout on, so every random draw is the full pass's)."""
    from gpt1.model.heads import FinetuneModel

    config = tiny_config(vocab_size=100, attn_pdrop=attn_pdrop, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    clf = FinetuneModel(GPT(config), "single", 3, classify_id=99, pdrop=0.0).train()
    x = torch.randint(0, 99, (4, 1, 12))
    mask = torch.ones(4, 1, 12)
    ends = [11, 4, 8, 11] if padded else [11] * 4
    for row, end in enumerate(ends):
        x[row, 0, end] = 99
        mask[row, 0, end + 1 :] = 0

    def outputs_and_grads(with_lm: bool, seed: int):
        clf.zero_grad()
        torch.manual_seed(seed)
        out, _ = clf(x, mask, with_lm=with_lm)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in clf.parameters() if p.grad is not None]

    at_out, at_grads = outputs_and_grads(with_lm=False, seed=1)
    full_out, full_grads = outputs_and_grads(with_lm=True, seed=1)
    torch.testing.assert_close(at_out, full_out, rtol=1e-5, atol=1e-6)
    assert len(at_grads) == len(full_grads)
    for got, want in zip(at_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    other_seed, _ = outputs_and_grads(with_lm=False, seed=2)
    assert not torch.allclose(other_seed, at_out)  # dropout is on: another draw, another output
    with torch.no_grad():  # the fast path's branch (no autograd) draws the same masks
        torch.manual_seed(1)
        no_grad_out, _ = clf(x, mask, with_lm=False)
    torch.testing.assert_close(no_grad_out, at_out, rtol=1e-5, atol=1e-6)
