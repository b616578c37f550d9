"""The LSTM baseline: GPT's interface, causal, tied head, task tokens, sizing rule, checkpoints."""

import json

import pytest
import torch
from conftest import TINIER_MODEL, check_causal, check_shapes_and_tied_head

from gpt1 import GPT, ModelConfig, model_preset, save_model
from gpt1.checkpoint_files import open_checkpoint
from gpt1.errors import CheckpointError, ConfigError
from gpt1.model.checkpoint import load_model
from gpt1.model.gpt import parameter_count
from gpt1.model.lstm import LSTMLM, LSTMConfig, lstm_config_for, lstm_parameter_count
from gpt1.model.registry import LanguageModel, build_model, model_flops, save_lstm


def small(**kw) -> LSTMConfig:
    return LSTMConfig(**{**dict(vocab_size=97, n_embd=32, hidden_size=48, n_positions=32), **kw})


def test_shapes_and_tied_head():
    torch.manual_seed(0)
    model = LSTMLM(small()).eval()
    check_shapes_and_tied_head(model, vocab_size=97, n_embd=32)
    assert model.lm_weight() is model.wte.weight


def test_causal_future_tokens_do_not_change_the_past():
    torch.manual_seed(0)
    model = LSTMLM(small()).eval()
    ids = torch.randint(0, 97, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = torch.randint(0, 97, (2, 5))
    check_causal(model, ids, changed, 7)


def test_rows_are_independent_and_right_padding_is_harmless():
    torch.manual_seed(0)
    model = LSTMLM(small()).eval()
    row = torch.randint(0, 97, (1, 6))
    padded = torch.cat([row, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    batch = torch.cat([padded, torch.randint(0, 97, (1, 10))], dim=0)
    torch.testing.assert_close(model(batch)[:1, :6], model(row))


def test_add_tokens_extends_the_tied_head():
    torch.manual_seed(0)
    model = LSTMLM(small())
    before = model.wte.weight.detach().clone()
    ids = model.add_tokens(3, generator=torch.Generator().manual_seed(1))
    assert ids == [97, 98, 99] and model.config.vocab_size == 100
    torch.testing.assert_close(model.wte.weight[:97], before)
    assert model.lm_logits(model(torch.tensor([[99, 5]]))).shape == (1, 2, 100)
    assert model.add_tokens(0) == []


def test_forget_gate_bias_and_parameter_count():
    model = LSTMLM(small(hidden_size=16))
    b = model.lstm.bias_ih_l0 + model.lstm.bias_hh_l0
    assert torch.all(b[16:32] == 1.0) and torch.all(b[:16] == 0) and torch.all(b[32:] == 0)
    assert model.num_parameters() == lstm_parameter_count(model.config)
    assert model.num_parameters(exclude_embeddings=True) == lstm_parameter_count(
        model.config, exclude_embeddings=True
    )
    assert model.num_parameters() - model.num_parameters(True) == 97 * 32


@pytest.mark.parametrize("preset", ["mini", "gpt1", "tiny"])
def test_params_rule_matches_the_transformer_within_a_few_percent(preset):
    mc = model_preset(preset)
    lc = lstm_config_for(mc)
    assert lc.n_layer == 1 and lc.n_embd == mc.n_embd and lc.hidden_size % 64 == 0
    ratio = lstm_parameter_count(lc, True) / parameter_count(mc, exclude_embeddings=True)
    # Rounding H to 64 moves the count by at most ~8 H E-sized rows; tiny is the coarsest case.
    assert 0.8 < ratio < 1.25, ratio


def test_paper_rule_gives_2048_units_for_gpt1():
    assert lstm_config_for(model_preset("gpt1"), rule="paper").hidden_size == 2048
    with pytest.raises(ConfigError):
        lstm_config_for(model_preset("gpt1"), rule="nope")


def test_bad_config_is_a_config_error():
    with pytest.raises(ConfigError):
        small(hidden_size=0)
    with pytest.raises(ConfigError):
        small(embd_pdrop=1.0)
    with pytest.raises(ConfigError, match="unknown key"):
        LSTMConfig.from_dict({"n_embd": 8, "n_head": 2})


def test_lstm_checkpoint_roundtrip(tmp_path):
    torch.manual_seed(0)
    model = LSTMLM(small()).eval()
    model.add_tokens(2)
    save_lstm(model, tmp_path / "ck")
    data = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert data["arch"] == "lstm" and data["model"]["vocab_size"] == 99
    loaded = load_model(open_checkpoint(tmp_path / "ck"))
    assert isinstance(loaded, LSTMLM) and open_checkpoint(tmp_path / "ck").arch == "lstm"
    ids = torch.randint(0, 99, (2, 9))
    torch.testing.assert_close(loaded.eval()(ids), model(ids))


def test_load_model_returns_gpt_for_plain_checkpoints(tmp_path):
    model = GPT(ModelConfig(**{**TINIER_MODEL, "n_positions": 16}))
    save_model(model, tmp_path / "g")
    assert open_checkpoint(tmp_path / "g").arch == "gpt"
    assert isinstance(load_model(open_checkpoint(tmp_path / "g")), GPT)


def test_unknown_arch_and_mismatched_weights_are_checkpoint_errors(tmp_path):
    model = LSTMLM(small())
    save_lstm(model, tmp_path / "ck")
    cfg_file = tmp_path / "ck" / "config.json"
    data = json.loads(cfg_file.read_text())
    data["arch"] = "rnn"
    cfg_file.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match='unknown "arch"'):
        load_model(open_checkpoint(tmp_path / "ck"))
    data["arch"] = "lstm"
    data["model"]["hidden_size"] = 64
    cfg_file.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="shape"):
        load_model(open_checkpoint(tmp_path / "ck"))


def test_trains_one_batch_down():
    torch.manual_seed(0)
    model = LSTMLM(small(embd_pdrop=0.0, resid_pdrop=0.0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 97, (4, 16))
    losses = []
    for _ in range(100):
        logits = model.lm_logits(model(ids[:, :-1]))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 97), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def prepared_folder(path, vocab=64, tokens=3000):
    import numpy as np

    from gpt1.text.shards import write_shard

    path.mkdir()
    rng = np.random.default_rng(0)
    # A learnable stream: mostly "next token = previous + 1", so a few steps lower the loss.
    stream = (np.cumsum(rng.integers(1, 3, size=tokens)) % vocab).astype(np.int64)
    write_shard(path / "train-0.bin", stream[:2500], n_docs=1, vocab_size=vocab)
    write_shard(path / "val-0.bin", stream[2500:], n_docs=1, vocab_size=vocab)
    meta = {
        "format": "gpt1-tokens",
        "version": 1,
        "vocab_size": vocab,
        "splits": {"train": {"shards": ["train-0.bin"]}, "val": {"shards": ["val-0.bin"]}},
    }
    (path / "meta.json").write_text(json.dumps(meta))
    return path


@pytest.mark.slow
def test_pretrain_arch_lstm_end_to_end_and_resume(tmp_path):
    from gpt1.cli import main

    data = prepared_folder(tmp_path / "data")
    run = tmp_path / "run"
    base = [
        "pretrain",
        "--preset",
        "tiny",
        "--arch",
        "lstm",
        "--data",
        str(data),
        "--out",
        str(run),
        "--save-every",
        "2",
        "--eval-every",
        "2",
        "-q",
    ]
    assert main(base + ["--max-steps", "2"]) == 0
    model = load_model(open_checkpoint(run))
    assert isinstance(model, LSTMLM) and model.config.vocab_size == 64
    assert model.config.hidden_size == lstm_config_for(model_preset("tiny")).hidden_size
    assert main(base + ["--max-steps", "4", "--resume", "auto"]) == 0
    data_json = json.loads((run / "final" / "config.json").read_text())
    assert data_json["arch"] == "lstm" and data_json["run"]["arch"] == "lstm"
    assert isinstance(load_model(open_checkpoint(run / "final")), LSTMLM)
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(m["step"] for m in metrics if "step" in m) == 4


def test_info_describes_an_lstm_checkpoint(tmp_path, capsys):
    from gpt1.cli import main

    torch.manual_seed(0)
    model = LSTMLM(LSTMConfig(vocab_size=50, n_embd=16, hidden_size=32, n_positions=20))
    save_lstm(model, tmp_path / "ck")
    assert main(["info", str(tmp_path / "ck"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["arch"] == "lstm" and info["parameters"] == model.num_parameters()
    assert info["flops_per_token"] > 0


def test_sample_continues_an_lstm_checkpoint_greedily(tmp_path):
    from gpt1.inference.sampling import Sampling
    from gpt1.recipes.sample import sample

    torch.manual_seed(0)
    model = LSTMLM(small(n_positions=8)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # a peaked distribution, so the argmax path is not all one token
    save_lstm(model, tmp_path / "ckpt")
    prompt = [5, 17, 3]
    greedy = Sampling(max_new_tokens=10, temperature=0)
    (got,) = sample(tmp_path / "ckpt", prompt_ids=prompt, sampling=greedy)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(10):  # past n_positions=8 only the last 8 tokens are read
            window = torch.tensor([ids[-8:]])
            ids.append(int(model.lm_logits(model(window))[0, -1].argmax()))
    assert got.ids == ids and got.prompt_len == 3 and len(set(ids[3:])) > 1


def test_both_architectures_satisfy_the_registry_protocol(tinier_config):
    config = tinier_config(n_positions=16)
    for arch, cls in (("gpt", GPT), ("lstm", LSTMLM)):
        model, flops, extra = build_model(config, arch, seq_len=16)
        assert isinstance(model, cls) and isinstance(model, LanguageModel)
        assert flops == model_flops(model, 16) == model.flops_per_token(16) > 0
        assert extra == ({} if arch == "gpt" else {"arch": "lstm"})
        ids = torch.randint(0, 50, (2, 5))
        hidden, head = model.eval()(ids, lengths=torch.tensor([5, 3]), with_head_weight=True)
        assert hidden.shape == (2, 5, 16) and head is model.wte.weight
        at = torch.tensor([4, 2])
        assert torch.allclose(model(ids, at=at), hidden[torch.arange(2), at], atol=1e-5)
        # One forward for both (gpt1.model.tied.TiedLM): states at positions carry no head weight.
        with pytest.raises(ValueError, match="no head weight"):
            model(ids, at=at, with_head_weight=True)
    with pytest.raises(ConfigError, match="unknown architecture"):
        build_model(config, "rnn")
