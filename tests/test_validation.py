"""Sizes read from files are checked for type and range, and against the device's memory, before
anything is allocated; weights must be finite; token ids must fit the vocabulary; files named
inside a model or data folder must stay inside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from gpt1.checkpoint_files import CONFIG, WEIGHTS, trained_context
from gpt1.cli import main
from gpt1.config import (
    ModelConfig,
    TrainConfig,
    check_task_record,
    model_preset,
    override_dotted,
    run_preset,
)
from gpt1.errors import CheckpointError, ConfigError, DataError, Gpt1Error
from gpt1.model import memory
from gpt1.model.checkpoint import load_checkpoint
from gpt1.model.gpt import GPT
from gpt1.model.memory import TooLargeError
from gpt1.recipes.convert import convert, load_hf, load_openai, save_hf
from gpt1.text.shards import write_shard
from gpt1.text.windows import open_prepared
from helpers import fault_cases
from helpers.tiny import (
    CHAR_PIECES,
    ODD_SIZES_MODEL,
    make_corpus,
    tiny_checkpoint,
    tiny_pretrain,
)

# A checkpoint over the character vocabulary needs a model as wide as it.
CHAR_VOCAB_MODEL = {**ODD_SIZES_MODEL, "vocab_size": len(CHAR_PIECES)}


def edit_config(folder: Path, **model_fields) -> None:
    data = json.loads((folder / CONFIG).read_text())
    data["model"].update(model_fields)
    (folder / CONFIG).write_text(json.dumps(data))


# ------------------------------------------------------------------------ types and ranges
@pytest.mark.parametrize(
    "value, expected",
    [
        ("2", "an integer"),
        (2.5, "an integer"),
        (True, "an integer"),
        (None, "an integer"),
        (0, "1..4,096"),
        (-3, "1..4,096"),
        (1_000_000_000, "1..4,096"),
    ],
)
def test_checkpoint_config_types_and_ranges(tmp_path, value, expected):
    folder = tiny_checkpoint(tmp_path / "ckpt", ODD_SIZES_MODEL, vocab=False)
    edit_config(folder, n_layer=value)
    with pytest.raises(CheckpointError, match=f"config.json: model.n_layer must be.*{expected}"):
        load_checkpoint(folder)


def test_other_model_fields_are_typed(tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt", ODD_SIZES_MODEL, vocab=False)
    for field, value in [
        ("n_embd", "32"),
        ("vocab_size", 1e3),
        ("embd_pdrop", "0.1"),
        ("layer_norm_epsilon", True),
        ("afn", 3),
        ("n_inner", 2.0),
    ]:
        edit_config(folder, **{field: value})
        with pytest.raises(CheckpointError, match=f"model.{field} must be"):
            load_checkpoint(folder)
        edit_config(folder, **{field: ModelConfig(**ODD_SIZES_MODEL).to_dict()[field]})
    load_checkpoint(folder)  # restored: loads again


@pytest.mark.parametrize("version", ["2", 1.0, True, None, -1])
def test_format_version_must_be_an_integer(tmp_path, version):
    folder = tiny_checkpoint(tmp_path / "ckpt", ODD_SIZES_MODEL, vocab=False)
    data = json.loads((folder / CONFIG).read_text())
    data["format_version"] = version
    (folder / CONFIG).write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="format_version must be an integer"):
        load_checkpoint(folder)


def test_info_refuses_a_float_size_instead_of_printing_it(tmp_path, capsys):
    folder = tiny_checkpoint(tmp_path / "ckpt", ODD_SIZES_MODEL, vocab=False)
    edit_config(folder, n_layer=2.5)
    assert main(["info", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "model.n_layer must be an integer, got 2.5" in err and "config.json" in err


def test_n_embd_must_divide_by_n_head():
    with pytest.raises(ConfigError, match="divisible"):
        ModelConfig(**{**ODD_SIZES_MODEL, "n_head": 5})


def resolve_run_file(command: str, toml: Path) -> object:
    """`command`'s settings resolved from the run file `toml`, as the command line would."""
    if command == "pretrain":
        from gpt1.recipes.pretrain import resolve_config

        return resolve_config("tiny", toml)
    from gpt1.recipes.finetune import resolve

    return resolve(toml, {"finetune": {"task": "sst2", "data": "d", "init": "none"}})


@pytest.mark.parametrize(
    "command,text,field",
    [
        ("pretrain", '[model]\nn_layer = "2"\n', "model.n_layer"),
        ("pretrain", "[model]\nn_layer = 2.5\n", "model.n_layer"),
        ("pretrain", "[train]\nbatch_size = true\n", "train.batch_size"),
        ("pretrain", "[train]\nlr = nan\n", "train.lr"),
        ("pretrain", "[data]\nn_ctx = 1.5\n", "data.n_ctx"),
        ("finetune", '[train]\nbatch_size = "32"\n', "train.batch_size"),
        ("finetune", "[finetune]\nlm_coef = true\n", "finetune.lm_coef"),
        ("finetune", "[finetune]\ntransfer_layers = 2.0\n", "finetune.transfer_layers"),
    ],
)
def test_run_file_values_are_typed(tmp_path, command, text, field):
    toml = tmp_path / "run.toml"
    toml.write_text(text)
    with pytest.raises(ConfigError, match=f"run.toml: {field} must be"):
        resolve_run_file(command, toml)


def test_set_values_are_typed():
    cfg = run_preset("tiny")
    for assignment in [
        "model.n_layer=2.5",
        "model.n_layer=true",
        "train.lr=inf",
        "model.n_layer=99999",
    ]:
        with pytest.raises(ConfigError, match=r"n_layer must be|lr must be|n_layer must be in"):
            override_dotted(cfg, assignment)


def test_training_config_from_dict_names_source():
    from gpt1.config import RunConfig

    with pytest.raises(ConfigError, match=r"x.toml \[train\]: train.max_steps must be an integer"):
        RunConfig.from_dict({"train": {"max_steps": "10"}}, "x.toml")
    TrainConfig(warmup=2000, epochs=3)  # ints are fine where a number is expected


# ----------------------------------------------------------------------------- memory
def test_model_too_large_for_memory_is_refused_from_config(tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt", ODD_SIZES_MODEL, vocab=False)
    # Within every per-field limit, but 10^15 parameters: no machine holds it.
    edit_config(folder, n_layer=4096, n_embd=2**17, n_head=2**10, n_inner=2**19)
    with pytest.raises(TooLargeError) as err:
        load_checkpoint(folder)
    msg = str(err.value)
    assert "config.json" in msg and "n_layer=4,096" in msg and "needs at least" in msg
    assert "PB" in msg or "TB" in msg


def test_config_larger_than_its_weights_is_refused(tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt", ODD_SIZES_MODEL, vocab=False)
    edit_config(folder, n_layer=64)  # fits in memory, but the file holds 2 layers
    with pytest.raises(CheckpointError, match="config and weights do not belong together"):
        load_checkpoint(folder)


def test_sample_refuses_a_billion_layers(tmp_path, capsys):
    folder = tiny_checkpoint(tmp_path / "ckpt", CHAR_VOCAB_MODEL)
    edit_config(folder, n_layer=1_000_000_000)
    assert main(["sample", str(folder), "--prompt", "x", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "model.n_layer" in err and "config.json" in err and "micro-batch" not in err


def test_memory_budget_is_device_memory(monkeypatch):
    cfg = model_preset("gpt1")
    need = memory.inference_bytes(cfg)
    assert need == 116_534_784 * 4
    monkeypatch.setattr(memory, "_cpu_available", lambda: need - 1)
    with pytest.raises(TooLargeError, match=r"466.1 MB .*116,534,784 parameters"):
        memory.ensure_model_fits(cfg, "preset gpt1")
    monkeypatch.setattr(memory, "_cpu_available", lambda: need)
    memory.ensure_model_fits(cfg, "preset gpt1")
    train = TrainConfig(micro_batch_size=8)
    assert memory.training_bytes(cfg, train, 512) > 4 * need


def test_cpu_available_reads_meminfo():
    have = memory._cpu_available()
    assert 0 < have < 1 << 62


def test_pretrain_refuses_before_writing_anything(tmp_path, monkeypatch, capsys):
    data = make_corpus(tmp_path / "d")
    monkeypatch.setattr(memory, "_cpu_available", lambda: 10_000)
    out = tmp_path / "run"
    assert main(tiny_pretrain(data, out, 1)) == 2
    err = capsys.readouterr().err
    assert "training needs at least" in err and "micro_batch_size=2" in err
    assert not (out / "run.json").exists()


def test_finetune_refuses_before_building(tmp_path, monkeypatch):
    from gpt1.config import FinetuneConfig
    from gpt1.recipes.finetune import check_training_memory
    from gpt1.tasks.registry import get_task
    from gpt1.train.distributed import env_info

    folder = tiny_checkpoint(tmp_path / "ckpt", ODD_SIZES_MODEL, vocab=False)
    task = get_task("sst2")
    cfg = FinetuneConfig(task="sst2", init=str(folder))
    check_training_memory(cfg, task, TrainConfig(), env_info())  # fits
    monkeypatch.setattr(memory, "_cpu_available", lambda: 10_000)
    with pytest.raises(TooLargeError, match="config.json: training needs"):
        check_training_memory(cfg, task, TrainConfig(), env_info())


# ----------------------------------------------------------------------------- task.json
GOOD_RECORD = {
    "task": "sst2",
    "kind": "single",
    "labels": ["0", "1"],
    "n_outputs": 2,
    "n_ctx": 16,
    "classify_id": 3,
    "clf_pdrop": 0.1,
    "question_delimiter": False,
    "spec": None,
}


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("n_outputs", 20_000_000, "1..1,048,576"),
        ("n_outputs", 1e12, "an integer"),
        ("n_outputs", "2", "an integer"),
        ("n_outputs", True, "an integer"),
        ("n_outputs", 3, "2 \\(from kind and labels\\)"),
        ("kind", "regress", "single or pair"),
        ("n_ctx", 0, "1..1,048,576"),
        ("classify_id", -1, "0..2,147,483,647"),
        ("labels", [1, 2], "list of strings"),
        ("clf_pdrop", 1.5, r"\[0, 1\)"),
    ],
)
def test_task_record_is_validated(field, value, expected):
    check_task_record(dict(GOOD_RECORD), "task.json")
    with pytest.raises(ConfigError, match=f"task.json: {field} must be .*{expected}"):
        check_task_record({**GOOD_RECORD, field: value}, "task.json")


@pytest.mark.parametrize("n_outputs", [20_000_000, 1e12])
def test_predict_refuses_huge_n_outputs_before_allocating(tmp_path, n_outputs, capsys):
    from gpt1.checkpoint_files import HEAD_FILE, TASK_FILE
    from gpt1.recipes.evaluate import load_finetuned

    folder = tiny_checkpoint(tmp_path / "ft", ODD_SIZES_MODEL, vocab=False)
    save_file(
        {"linear.weight": torch.zeros(2, 32), "linear.bias": torch.zeros(2)},
        str(folder / HEAD_FILE),
    )
    (folder / TASK_FILE).write_text(
        json.dumps({**GOOD_RECORD, "n_outputs": n_outputs, "labels": None})
    )
    with pytest.raises(CheckpointError, match="task.json: n_outputs must be"):
        load_finetuned(folder)
    assert main(["evaluate", str(folder), "--data", str(tmp_path)]) == 2
    assert "n_outputs must be" in capsys.readouterr().err


def test_run_json_context_must_be_an_integer(tmp_path):
    run = tmp_path / "run"
    folder = tiny_checkpoint(run / "final", ODD_SIZES_MODEL, vocab=False)
    for value, expected in [(16, 16), (True, None), ("16", None), (16.0, None), (-1, None)]:
        (run / "run.json").write_text(json.dumps({"data": {"n_ctx": value}}))
        assert trained_context(folder) == expected


# --------------------------------------------------------------------------- HF config
def hf_folder(folder: Path) -> Path:
    torch.manual_seed(0)
    return save_hf(GPT(ModelConfig(**ODD_SIZES_MODEL)), folder)


@pytest.mark.parametrize(
    "value, expected",
    [(1_000_000_000, "1..4,096"), ("2", "an integer"), (2.5, "an integer"), (True, "an integer")],
)
def test_hf_config_sizes_are_checked_first(tmp_path, value, expected, capsys):
    folder = hf_folder(tmp_path / "hf")
    data = json.loads((folder / "config.json").read_text())
    data["n_layer"] = value
    (folder / "config.json").write_text(json.dumps(data))
    assert main(["convert", str(folder), str(tmp_path / "out"), "--from", "hf"]) == 2
    err = capsys.readouterr().err
    assert (
        "config.json" in err
        and "model.n_layer must be" in err
        and expected.replace("\\", "") in err
    )
    assert not (tmp_path / "out").exists()


def test_hf_config_larger_than_its_weights(tmp_path):
    folder = hf_folder(tmp_path / "hf")
    data = json.loads((folder / "config.json").read_text())
    data["n_layer"] = 4000
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="do not belong together"):
        load_hf(folder)


# ------------------------------------------------------------------------ OpenAI release
def release(folder: Path) -> Path:
    """A tiny release: the arrays in OpenAI's order, split into 10 shards."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(**ODD_SIZES_MODEL))
    sd = model.state_dict()
    shapes, arrays = [], []
    arrays += [sd["wpe.weight"].numpy(), sd["wte.weight"].numpy()]
    from gpt1.recipes.convert import OPENAI_BLOCK

    for i in range(ODD_SIZES_MODEL["n_layer"]):
        for name, kind in OPENAI_BLOCK:
            t = sd[f"h.{i}.{name}"].numpy()
            arrays.append(t.T[None] if kind == "linear" else t)
    shapes = [list(a.shape) for a in arrays]
    flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float32)
    folder.mkdir(parents=True)
    for i, part in enumerate(np.array_split(flat, 10)):
        np.save(folder / f"params_{i}.npy", part)
    (folder / "params_shapes.json").write_text(json.dumps(shapes))
    return folder


def test_openai_release_round_trip_still_loads(tmp_path):
    model = load_openai(release(tmp_path / "oai"), n_head=4)
    assert model.config.n_layer == 2


def test_openai_shapes_for_200k_layers_are_refused_fast(tmp_path, capsys):
    folder = release(tmp_path / "oai")
    shapes = json.loads((folder / "params_shapes.json").read_text())
    block = shapes[2:14]
    (folder / "params_shapes.json").write_text(json.dumps(shapes[:2] + block * 200_000))
    assert (folder / "params_shapes.json").stat().st_size > 10_000_000
    assert (
        main(["convert", str(folder), str(tmp_path / "out"), "--from", "openai", "--n-head", "4"])
        == 2
    )
    err = capsys.readouterr().err
    assert "params_shapes.json: 20,600,021 bytes of shapes" in err and "micro-batch" not in err
    # Under the size cap but still too many layers: refused by counting, before any model.
    (folder / "params_shapes.json").write_text(json.dumps(shapes[:2] + [[1]] * 12 * 5000))
    with pytest.raises(CheckpointError, match="describe 5,000 layers; model.n_layer must be"):
        load_openai(folder, n_head=4)


def test_openai_shapes_must_match_the_shards(tmp_path):
    folder = release(tmp_path / "oai")
    shapes = json.loads((folder / "params_shapes.json").read_text())
    shapes[1] = [1000, 32]  # a larger token table than the shards hold
    (folder / "params_shapes.json").write_text(json.dumps(shapes))
    with pytest.raises(CheckpointError, match="shards hold .* floats but params_shapes.json needs"):
        load_openai(folder, n_head=4)


@pytest.mark.parametrize("bad", [[["8"], [8]], [[8, True]], [[8, 2.0]], [[-8]], [[]]])
def test_openai_shape_entries_are_integers(tmp_path, bad):
    folder = release(tmp_path / "oai")
    shapes = json.loads((folder / "params_shapes.json").read_text())
    shapes[2 : 2 + len(bad)] = bad
    (folder / "params_shapes.json").write_text(json.dumps(shapes))
    with pytest.raises(CheckpointError, match="positive integers|expected a list"):
        load_openai(folder, n_head=4)


# ------------------------------------------------------------------------ finite weights
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_gpt1_checkpoint_with_nonfinite_weights_is_refused(tmp_path, bad, capsys):
    folder = tiny_checkpoint(tmp_path / "ckpt", CHAR_VOCAB_MODEL)
    state = load_file(str(folder / WEIGHTS))
    state["h.1.mlp.c_fc.weight"][3, 4] = bad
    save_file(state, str(folder / WEIGHTS))
    with pytest.raises(CheckpointError, match="'h.1.mlp.c_fc.weight' holds 1 NaN or infinite"):
        load_checkpoint(folder)
    assert main(["sample", str(folder), "--prompt", "x", "--max-new-tokens", "2"]) == 2
    assert "h.1.mlp.c_fc.weight" in capsys.readouterr().err
    assert main(["convert", str(folder), str(tmp_path / "out"), "--from", "gpt1"]) == 2
    assert not (tmp_path / "out").exists()


def test_hf_folder_with_nan_is_refused(tmp_path):
    folder = hf_folder(tmp_path / "hf")
    state = load_file(str(folder / "model.safetensors"))
    state["transformer.tokens_embed.weight"][0, 0] = float("nan")
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="transformer.tokens_embed.weight"):
        convert(folder, tmp_path / "out", "hf")


def test_hf_pytorch_bin_with_nan_is_refused(tmp_path):
    folder = hf_folder(tmp_path / "hf")
    state = load_file(str(folder / "model.safetensors"))
    state["transformer.h.0.ln_1.weight"][0] = float("inf")
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="transformer.h.0.ln_1.weight"):
        load_hf(folder)


def test_openai_shard_with_nan_is_refused(tmp_path):
    folder = release(tmp_path / "oai")
    part = np.load(folder / "params_9.npy")
    part[-1] = np.nan
    np.save(folder / "params_9.npy", part)
    with pytest.raises(CheckpointError, match="'h.1.ln_2.bias' holds NaN"):
        load_openai(folder, n_head=4)


def test_finetuned_head_with_nan_is_refused(tmp_path):
    from gpt1.checkpoint_files import HEAD_FILE, TASK_FILE
    from gpt1.recipes.evaluate import load_finetuned

    folder = tiny_checkpoint(tmp_path / "ft", ODD_SIZES_MODEL, vocab=False)
    save_file(
        {"linear.weight": torch.full((2, 32), float("nan")), "linear.bias": torch.zeros(2)},
        str(folder / HEAD_FILE),
    )
    (folder / TASK_FILE).write_text(json.dumps(GOOD_RECORD))
    with pytest.raises(CheckpointError, match="head.safetensors: tensor 'linear.weight'"):
        load_finetuned(folder)


# --------------------------------------------------------------------------- token shards
def test_token_ids_at_or_above_vocab_are_refused_at_open(tmp_path, capsys):
    data = make_corpus(tmp_path / "d", vocab=300)
    ids = np.arange(3000) % 300
    ids[1234] = 300
    write_shard(data / "train-00001.bin", ids, 1, 400)
    with pytest.raises(DataError, match=r"train-00001.bin: token id 300 at position 1,234"):
        open_prepared(data)
    assert main(tiny_pretrain(data, tmp_path / "run")) == 2
    assert "train-00001.bin" in capsys.readouterr().err


def test_token_id_check_is_chunked(tmp_path, monkeypatch):
    import gpt1.text.windows

    monkeypatch.setattr(gpt1.text.windows, "ID_CHECK_CHUNK", 1000)
    data = make_corpus(tmp_path / "d", vocab=300)
    ids = np.arange(3000) % 300
    ids[2999] = 65535
    write_shard(data / "train-00001.bin", ids, 1, 65536)  # still uint16
    with pytest.raises(DataError, match="token id 65535 at position 2,999"):
        open_prepared(data)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"vocab_size": 2**40}, "vocab_size"),
        ({"vocab_size": 300.0}, "vocab_size"),
        ({"dtype": "float32"}, "dtype"),
        ({"dtype": "uint32"}, None),
        ({"version": "1"}, "version"),
    ],
)
def test_meta_json_fields_are_checked(tmp_path, change, field):
    data = make_corpus(tmp_path / "d")
    meta = json.loads((data / "meta.json").read_text())
    meta.update(change)
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError) as err:
        open_prepared(data)
    if field:
        assert f"field {field!r}" in str(err.value)
    else:
        assert "stores uint16 ids but meta.json says uint32" in str(err.value)


def test_shard_size_must_match_its_header(tmp_path):
    data = make_corpus(tmp_path / "d")
    with open(data / "val-00000.bin", "ab") as fh:
        fh.write(b"\0")  # an odd byte: not a whole number of uint16 ids
    with pytest.raises(DataError, match="val-00000.bin: shard is .* bytes but its header"):
        open_prepared(data)


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/passwd", "link.bin", 7, ""])
def test_meta_json_shard_paths_stay_inside(tmp_path, name):
    data = make_corpus(tmp_path / "d")
    outside = make_corpus(tmp_path / "other")
    (data / "link.bin").symlink_to(outside / "train-00000.bin")
    os.replace(outside / "train-00000.bin", tmp_path / "outside.bin")
    write_shard(outside / "train-00000.bin", np.arange(100) % 300, 1, 300)
    meta = json.loads((data / "meta.json").read_text())
    meta["splits"]["train"]["shards"] = [name]
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="outside|not a non-empty string"):
        open_prepared(data)


# ---------------------------------------------------------------- HF index path escapes
def sharded_hf(folder: Path) -> Path:
    folder = hf_folder(folder)
    state = load_file(str(folder / "model.safetensors"))
    names = sorted(state)
    half = len(names) // 2
    save_file({k: state[k] for k in names[:half]}, str(folder / "part-1.safetensors"))
    save_file({k: state[k] for k in names[half:]}, str(folder / "part-2.safetensors"))
    weight_map = {
        k: ("part-1.safetensors" if i < half else "part-2.safetensors") for i, k in enumerate(names)
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "model.safetensors").unlink()
    return folder


def test_sharded_hf_folder_loads(tmp_path):
    assert load_hf(sharded_hf(tmp_path / "hf")).config.n_layer == 2


@pytest.mark.parametrize(
    "target",
    ["../outside.safetensors", "ABSOLUTE", "sub/../../outside.safetensors", "link.safetensors", 5],
)
def test_hf_index_paths_outside_the_folder_are_refused(tmp_path, target, capsys):
    folder = sharded_hf(tmp_path / "hf")
    os.replace(folder / "part-2.safetensors", tmp_path / "outside.safetensors")
    (folder / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    if target == "ABSOLUTE":
        target = str(tmp_path / "outside.safetensors")
    index = folder / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = {
        k: (target if v == "part-2.safetensors" else v) for k, v in data["weight_map"].items()
    }
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="outside|file names|not a non-empty string"):
        load_hf(folder)
    assert main(["convert", str(folder), str(tmp_path / "out"), "--from", "hf"]) == 2
    assert "model.safetensors.index.json" in capsys.readouterr().err


def test_all_errors_are_gpt1_errors():
    assert issubclass(TooLargeError, Gpt1Error)


# ------------------------------------------------------------------------ LSTM baseline
@pytest.mark.parametrize(
    "change, expected",
    [
        ({"hidden_size": "64"}, "lstm.hidden_size must be an integer"),
        ({"n_layer": 10**9}, "lstm.n_layer must be in 1..64"),
        ({"hidden_size": 2**20, "n_layer": 64}, "needs at least"),
        ({"hidden_size": 512}, "do not belong together"),
    ],
)
def test_lstm_checkpoint_sizes_are_checked(tmp_path, change, expected):
    from gpt1.checkpoint_files import open_checkpoint
    from gpt1.model.checkpoint import load_model
    from gpt1.model.lstm import LSTMLM, LSTMConfig
    from gpt1.model.registry import save_lstm

    torch.manual_seed(0)
    folder = save_lstm(
        LSTMLM(LSTMConfig(vocab_size=50, n_embd=16, hidden_size=32, n_positions=24)),
        tmp_path / "lstm",
    )
    edit_config(folder, **change)
    with pytest.raises(Gpt1Error, match=expected):
        load_model(open_checkpoint(folder))


def test_sample_refuses_num_samples_that_cannot_fit(tmp_path, capsys):
    folder = tiny_checkpoint(tmp_path / "ckpt", CHAR_VOCAB_MODEL)
    sample = ["sample", str(folder), "--prompt-ids", "1 2"]
    assert main([*sample, "--max-new-tokens", "20", "--num-samples", str(10**12)]) == 2
    err = capsys.readouterr().err
    assert "sampling needs at least" in err and "num_samples=1,000,000,000,000" in err
    assert main([*sample, "--max-new-tokens", "2", "--num-samples", "3"]) == 0


def test_zeroshot_scorer_refuses_nan_log_probs():
    from gpt1.inference.scoring import Scorer

    torch.manual_seed(0)
    model = GPT(ModelConfig(**ODD_SIZES_MODEL)).eval()
    reqs = [([1, 2, 3], [4, 5]), ([1, 2], [6])]
    assert all(np.isfinite(s.total) for s in Scorer(model).score(reqs))
    with torch.no_grad():  # finite weights can still overflow: a NaN must not become a score
        model.h[0].ln_1.weight.fill_(float("nan"))
    with pytest.raises(Gpt1Error, match="NaN log-probabilities"):
        Scorer(model).score(reqs)


def test_evaluate_refuses_nan_outputs():
    from types import SimpleNamespace

    from gpt1.inference.prediction import predict_outputs

    class NanModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids, mask, with_lm=False):
            return torch.full((ids.shape[0], 2), float("nan")), None

    enc = SimpleNamespace(items=[[[1, 2, 3]], [[1, 2]]], labels=[0, 1])
    task = SimpleNamespace(regression=False)
    with pytest.raises(Gpt1Error, match="NaN or infinite outputs"):
        predict_outputs(NanModel(), task, enc, 2)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_refuses_nan_logits(temperature):
    from gpt1.inference.generate import generate

    torch.manual_seed(0)
    model = GPT(ModelConfig(**ODD_SIZES_MODEL))
    with torch.no_grad():
        model.h[1].mlp.c_fc.bias.fill_(float("inf"))
    with pytest.raises(Gpt1Error, match="NaN or infinite logits"):
        generate(model, torch.tensor([[1, 2]]), 3, temperature=temperature)


def test_oversized_json_metadata_is_refused_before_parsing(tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt", ODD_SIZES_MODEL, vocab=False)
    text = (folder / CONFIG).read_text()
    (folder / CONFIG).write_text(text[:-2] + " " * 16_000_000 + text[-2:])
    with pytest.raises(
        CheckpointError, match=r"config.json: 16,000,\d+ bytes; a file of this kind"
    ):
        load_checkpoint(folder)
    data = make_corpus(tmp_path / "d")
    with open(data / "meta.json", "a") as fh:
        fh.write(" " * 16_000_001)
    with pytest.raises(DataError, match="meta.json: .* bytes"):
        open_prepared(data)


def test_a_task_record_whose_task_cannot_be_built_names_task_json():
    from gpt1.inference.loading import task_of

    record = {"task": "tsv", "kind": "single", "n_outputs": 2, "labels": ["a", "b"], "spec": None}
    with pytest.raises(ConfigError, match=r"^task.json: task tsv needs --columns"):
        task_of(record)


def test_json_metadata_with_an_integer_python_will_not_convert_is_refused(tmp_path):
    """An integer of 5,000 digits is JSON, but past Python's 4,300-digit limit: a refusal naming
    the file, wherever the file is read (run.json is read for the trained window)."""
    run = tmp_path / "run"
    folder = tiny_checkpoint(run / "final", ODD_SIZES_MODEL, vocab=False)
    (run / "run.json").write_text('{"data": {"n_ctx": 1' + "0" * 5000 + "}}")
    assert trained_context(folder) is None
    text = (folder / CONFIG).read_text()
    (folder / CONFIG).write_text(
        text.replace('"format_version": 1', '"format_version": 1' + "0" * 5000)
    )
    with pytest.raises(CheckpointError, match=r"config.json: unreadable JSON \(Exceeds the limit"):
        load_checkpoint(folder)


def test_hub_snapshot_links_into_blobs_are_followed(tmp_path):
    # huggingface_hub's cache: snapshots/REV/NAME -> ../../blobs/HASH
    repo = tmp_path / "models--openai--tiny"
    folder = sharded_hf(repo / "snapshots" / "abc123")
    (repo / "blobs").mkdir()
    for name in ("part-1.safetensors", "part-2.safetensors"):
        os.replace(folder / name, repo / "blobs" / f"hash-{name}")
        (folder / name).symlink_to(Path("../../blobs") / f"hash-{name}")
    assert load_hf(folder).config.n_layer == 2
    os.replace(repo / "blobs", tmp_path / "elsewhere")
    (repo / "blobs").symlink_to(tmp_path / "elsewhere")  # blobs itself elsewhere: still the cache's
    assert load_hf(folder).config.n_layer == 2


def test_cuda_budget_is_the_device_total(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(total_memory=80 * 10**9, name="Fake GPU"),
    )
    assert memory.available_bytes("cuda:1") == (80 * 10**9, "cuda:1 (Fake GPU) has")
    cfg = ModelConfig(
        **{**ODD_SIZES_MODEL, "n_layer": 4096, "n_embd": 4096, "n_head": 32}
    )  # ~825B params
    monkeypatch.setattr(memory, "_cpu_available", lambda: 10**15)
    with pytest.raises(TooLargeError, match=r"cuda:1 \(Fake GPU\) has 80.0 GB"):
        memory.ensure_model_fits(cfg, "config.json", "cuda:1")
    memory.ensure_model_fits(cfg, "config.json", "cpu")


@pytest.mark.parametrize("edit", list(fault_cases.META_EDITS))
def test_meta_json_counts_and_vocab_size_are_checked_against_the_shards(tmp_path, edit):
    change, field, shard = fault_cases.META_EDITS[edit]
    data = make_corpus(tmp_path / "d")
    meta = json.loads((data / "meta.json").read_text())
    change(meta)
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError) as err:
        open_prepared(data)
    message = str(err.value)
    assert "meta.json" in message and f"field {field!r}" in message and shard in message
    assert len(message.splitlines()) == 1
