"""The one config resolver: precedence, derived sizes, one meaning per flag, frozen results,
and run.json files written by earlier versions still loading."""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from gpt1.config import (
    FINETUNE_TRAIN,
    DataConfig,
    FinetuneConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    from_dict,
    model_preset,
    override_dotted,
    resolve_finetune,
    resolve_pretrain,
)
from gpt1.errors import ConfigError

FT_FLAGS = {"finetune": {"task": "sst2", "data": "glue/SST-2", "init": "none"}}


# ------------------------------------------------------------------------- precedence
def test_pretrain_precedence_preset_toml_flags_set():
    preset = resolve_pretrain("tiny")
    assert preset.train.lr == 1e-3 and preset.model.n_layer == 2  # the tiny recipe
    toml = {"train": {"lr": 0.1, "warmup": 5}, "model": {"n_layer": 3}}
    assert resolve_pretrain("tiny", toml).train.lr == 0.1  # TOML beats preset
    flags = {"train": {"lr": 0.2, "seed": None}}  # None: flag not given
    cfg = resolve_pretrain("tiny", toml, flags)
    assert (cfg.train.lr, cfg.train.warmup, cfg.train.seed) == (0.2, 5, 1234)  # flags beat TOML
    cfg = resolve_pretrain("tiny", toml, flags, ["train.lr=0.3", "model.n_layer=4"])
    assert (cfg.train.lr, cfg.model.n_layer, cfg.train.warmup) == (0.3, 4, 5)  # --set beats all
    assert cfg.train.batch_size == 4  # untouched: the preset's


def test_preset_argument_beats_the_tomls_preset_key():
    assert resolve_pretrain(None, {"preset": "tiny"}).model.n_embd == 64
    assert resolve_pretrain("mini", {"preset": "tiny"}).model.n_embd == 384
    assert resolve_pretrain().model.n_embd == 768  # default: gpt1


def test_finetune_precedence_defaults_toml_flags_set():
    cfg, train = resolve_finetune(flags=FT_FLAGS)
    assert (train.lr, train.batch_size, cfg.lm_coef) == (FINETUNE_TRAIN["lr"], 32, 0.5)
    toml = {"train": {"lr": 1e-4}, "finetune": {"lm_coef": 0.25}}
    cfg, train = resolve_finetune(toml, FT_FLAGS)
    assert (train.lr, cfg.lm_coef) == (1e-4, 0.25)
    flags = {"finetune": {**FT_FLAGS["finetune"], "lm_coef": 0.0}, "train": {"lr": 2e-4}}
    cfg, train = resolve_finetune(toml, flags)
    assert (train.lr, cfg.lm_coef) == (2e-4, 0.0)
    cfg, train = resolve_finetune(toml, flags, ["train.lr=3e-4", "finetune.lm_coef=1"])
    assert (train.lr, cfg.lm_coef) == (3e-4, 1.0)


def test_errors_name_the_layer_they_came_from():
    with pytest.raises(ConfigError, match=r"run.toml: .*train.lr must be"):
        resolve_pretrain("tiny", {"train": {"lr": "fast"}}, toml_source="run.toml")
    with pytest.raises(ConfigError, match=r"command line: .*batch_size must be positive"):
        resolve_pretrain("tiny", flags={"train": {"batch_size": 0}})
    with pytest.raises(ConfigError, match=r"--set: .*divisible"):
        resolve_pretrain("tiny", sets=["model.n_head=3"])
    with pytest.raises(ConfigError, match="unknown key finetune.nope"):
        resolve_finetune({"finetune": {"nope": 1}}, FT_FLAGS)
    with pytest.raises(ConfigError, match="unknown section"):
        resolve_finetune(flags=FT_FLAGS, sets=["model.n_embd=8"])
    with pytest.raises(ConfigError, match="--task and --data are required"):
        resolve_finetune()


def test_integer_settings_are_within_64_bits_and_seeds_within_32():
    """torch and numpy fail on wider integers with an OverflowError (numpy also on a negative
    seed) deep in a run; every integer setting is refused where the config is validated."""
    with pytest.raises(ConfigError, match=r"--set: train.batch_size must be within ±\(2\*\*63-1\)"):
        resolve_finetune(flags=FT_FLAGS, sets=["train.batch_size=" + "1" + "0" * 30])
    with pytest.raises(ConfigError, match=r"run.toml: .*train.max_steps must be within"):
        resolve_pretrain("tiny", {"train": {"max_steps": 2**63}}, toml_source="run.toml")
    for seed in (-1, 2**32):
        with pytest.raises(ConfigError, match=r"train.seed must be in 0..2\*\*32-1"):
            resolve_pretrain("tiny", flags={"train": {"seed": seed}})
    assert resolve_pretrain("tiny", flags={"train": {"seed": 2**32 - 1}}).train.seed == 2**32 - 1


# ---------------------------------------------------------------------- derived sizes
def test_n_inner_follows_n_embd_unless_set():
    cfg = resolve_pretrain("tiny", sets=["model.n_embd=128"])
    assert (cfg.model.n_embd, cfg.model.n_inner, cfg.model.head_dim) == (128, 512, 64)
    cfg = resolve_pretrain("tiny", {"model": {"n_embd": 96, "n_head": 3}})
    assert (cfg.model.n_inner, cfg.model.head_dim) == (384, 32)
    # Set explicitly in the same resolution (any layer, any order): kept.
    cfg = resolve_pretrain("tiny", sets=["model.n_inner=200", "model.n_embd=128"])
    assert cfg.model.n_inner == 200
    cfg = resolve_pretrain("tiny", {"model": {"n_inner": 100}}, sets=["model.n_embd=128"])
    assert cfg.model.n_inner == 100
    # n_inner=none asks for the derived width again.
    cfg = resolve_pretrain(
        "tiny", {"model": {"n_inner": 100}}, sets=["model.n_embd=128", "model.n_inner=none"]
    )
    assert cfg.model.n_inner == 512


def test_derive_keeps_derived_sizes_following():
    tiny = model_preset("tiny")
    assert tiny.derive(n_embd=128).n_inner == 512
    assert tiny.derive(n_embd=128, n_inner=300).n_inner == 300
    custom = tiny.derive(n_inner=100)  # a width chosen on purpose stays
    assert custom.derive(n_embd=128).n_inner == 100
    assert override_dotted(resolve_pretrain("tiny"), "model.n_embd=128").model.n_inner == 512


# ------------------------------------------------------------------------- --max-steps
def _captured(monkeypatch, module, name, result):
    seen = {}

    def fake(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        return result

    monkeypatch.setattr(module, name, fake)
    return seen


def test_max_steps_means_train_max_steps_in_both_commands(monkeypatch, tmp_path):
    import gpt1.recipes.finetune as ft
    import gpt1.recipes.pretrain as pt
    from gpt1.cli import main

    # Both commands only parse and resolve here: the recipe each would run is a recorder.
    pretrain = ["pretrain", "--preset", "tiny", "--data", "d", "--out", str(tmp_path / "p")]
    ft_out = str(tmp_path / "f")
    finetune = ["finetune", "--task", "sst2", "--data", "d", "--init", "none", "--out", ft_out]
    done = SimpleNamespace(interrupted=0, final_dir=None)
    seen = _captured(monkeypatch, pt, "pretrain", done)
    assert main([*pretrain, "--max-steps", "7"]) == 0
    assert seen["args"][0].train.max_steps == 7
    seen = _captured(monkeypatch, ft, "finetune", (done, {}))
    assert main([*finetune, "--max-steps", "7"]) == 0
    train_cfg = seen["args"][1]
    assert train_cfg.max_steps == 7
    assert seen["kwargs"].get("max_steps_cap", 0) == 0 and len(seen["args"]) < 5
    # The same setting by --set, in either command.
    assert main([*finetune, "--set", "train.max_steps=9"]) == 0
    assert seen["args"][1].max_steps == 9


def test_finetune_run_length():
    from gpt1.recipes.finetune import run_length

    train = TrainConfig(**FINETUNE_TRAIN)  # batch 32, 3 epochs
    assert run_length(train, 320).max_steps == 30  # (320 // 32) * 3
    exact = dataclasses.replace(train, max_steps=50)
    assert run_length(exact, 320).max_steps == 50  # beyond 3 epochs: runs on
    assert run_length(exact, 320, cap=20).max_steps == 20  # the library's cap for sweeps
    assert run_length(train, 320, cap=100).max_steps == 30
    assert train.max_steps == 0  # the input is untouched


# ------------------------------------------------------------------------------ frozen
def test_resolved_configs_are_immutable():
    cfg = resolve_pretrain("tiny")
    for obj, name in (
        (cfg.model, "n_embd"),
        (cfg.train, "lr"),
        (cfg.data, "n_ctx"),
        (cfg, "model"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, getattr(obj, name))
    ft_cfg, train = resolve_finetune(flags=FT_FLAGS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ft_cfg.lm_coef = 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        train.max_steps = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        model_preset("gpt1").vocab_size += 3


def test_adding_task_tokens_leaves_a_shared_config_alone():
    from gpt1.model.gpt import GPT

    config = model_preset("tiny")
    pretrained = GPT(config)
    fresh = type(pretrained)(pretrained.config)  # as fine-tuning's layer transfer does
    ids = fresh.add_tokens(3)
    assert ids == [512, 513, 514] and fresh.config.vocab_size == 515
    assert pretrained.config.vocab_size == config.vocab_size == 512
    assert fresh.wte.weight.shape[0] == 515 and pretrained.wte.weight.shape[0] == 512


# ---------------------------------------------------------------------- saved run files
OLD_PRETRAIN_RUN = {  # a run.json as `gpt1 pretrain` wrote it: one flat [train] table
    "model": {
        "vocab_size": 300,
        "n_positions": 64,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 2,
        "n_inner": 256,
        "afn": "gelu",
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "resid_pdrop": 0.1,
        "layer_norm_epsilon": 1e-05,
        "initializer_range": 0.02,
        "embd_dropout": "sum",
    },
    "train": {
        "micro_batch_size": 2,
        "batch_size": 4,
        "max_steps": 20,
        "epochs": 100.0,
        "total_steps": 0,
        "lr": 0.001,
        "schedule": "warmup_cosine",
        "warmup": 2,
        "oai_first_step": True,
        "weight_decay": 0.01,
        "beta1": 0.9,
        "beta2": 0.999,
        "eps": 1e-08,
        "grad_clip": 1.0,
        "optimizer": "oai",
        "precision": "auto",
        "compile": False,
        "gradient_checkpointing": False,
        "distributed": "ddp",
        "device": "auto",
        "save_every": 10,
        "keep_last": 3,
        "eval_every": 10,
        "log_every": 1,
        "seed": 1234,
        "resume": "",
        "peak_flops": 0.0,
        "loss_chunk_tokens": 4096,
        "quiet": False,
        "loggers": "jsonl,tensorboard",
        "tracker_project": "gpt1",
        "mlflow_uri": "",
    },
    "data": {"path": "runs/d", "n_ctx": 32, "val_windows": 8},
}


def test_old_run_json_files_load(tmp_path):
    file = tmp_path / "run.json"
    file.write_text(json.dumps(OLD_PRETRAIN_RUN))
    cfg = RunConfig.from_dict(json.loads(file.read_text()), str(file))
    # loads and writes back as is, the keys added since (reading text files) at their defaults
    text_keys = {"order": "auto", "tokenizer": "", "text_field": "text", "doc_sep": ""}
    data = {**OLD_PRETRAIN_RUN["data"], **text_keys, "strip_gutenberg": False, "workers": 1}
    assert cfg.to_dict() == {**OLD_PRETRAIN_RUN, "data": data}
    assert cfg.model.n_inner == 256 and cfg.train.max_steps == 20
    # An older file without the newer keys takes their defaults.
    old = {
        **OLD_PRETRAIN_RUN,
        "train": {
            k: v
            for k, v in OLD_PRETRAIN_RUN["train"].items()
            if k
            not in ("loss_chunk_tokens", "peak_flops", "loggers", "tracker_project", "mlflow_uri")
        },
    }
    assert RunConfig.from_dict(old).train.loss_chunk_tokens == 4096
    assert RunConfig.from_dict(old).train.loggers == "jsonl"
    # A fine-tuning run.json: [finetune] and [train] tables.
    ft = {
        "finetune": dataclasses.asdict(FinetuneConfig(task="sst2", data="d", init="none")),
        "train": OLD_PRETRAIN_RUN["train"],
    }
    assert from_dict(FinetuneConfig, ft["finetune"]).task == "sst2"
    assert from_dict(TrainConfig, ft["train"]) == TrainConfig(**OLD_PRETRAIN_RUN["train"])
    assert from_dict(DataConfig, OLD_PRETRAIN_RUN["data"]).n_ctx == 32


def test_a_resolved_config_round_trips_through_run_json():
    cfg = resolve_pretrain("tiny", sets=["model.n_embd=128"])
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.model.n_inner == 512
    assert ModelConfig.from_dict(cfg.model.to_dict()) == cfg.model


def test_the_demos_model_settings_give_gpt1s_mlp_width():
    """The demo widens the tiny preset by --set; its model must keep the 4x MLP that the
    transformers export (`gpt1 convert --to hf`) requires."""
    from gpt1.recipes.demo import DemoSettings

    s = DemoSettings()
    sets = [
        f"model.n_layer={s.n_layer}",
        f"model.n_embd={s.n_embd}",
        f"model.n_head={s.n_head}",
        f"model.n_positions={s.n_ctx}",
    ]
    model = resolve_pretrain("tiny", sets=sets).model
    assert model.n_embd == s.n_embd != model_preset("tiny").n_embd
    assert model.n_inner == 4 * s.n_embd


def test_a_config_that_is_a_device_is_refused_not_read_forever():
    from gpt1.config import load_toml
    from gpt1.errors import ConfigError

    with pytest.raises(ConfigError, match="not a file"):
        load_toml("/dev/zero")


def test_a_json_file_that_is_a_device_or_folder_is_refused_not_read(tmp_path):
    from gpt1.config import read_json_file

    for path in ("/dev/zero", tmp_path):
        with pytest.raises(ConfigError, match="not a file"):
            read_json_file(path)
