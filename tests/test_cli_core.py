"""`gpt1 info`, `gpt1 convert` and `gpt1 sample` end to end through `gpt1.cli.main`."""

import json

import pytest
import torch
from conftest import TINY_MODEL

from gpt1 import GPT, ModelConfig, load_checkpoint, save_model
from gpt1.cli import main


@pytest.fixture
def ckpt(tmp_path):
    torch.manual_seed(0)
    return save_model(GPT(ModelConfig(**TINY_MODEL)), tmp_path / "ckpt")


def test_info_json_preset(capsys):
    assert main(["info", "gpt1", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"] == 116_534_784
    assert info["parameters_without_embeddings"] == 85_054_464


def test_info_checkpoint(ckpt, capsys):
    assert main(["info", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert "n_layer" in out and f"{GPT(ModelConfig(**TINY_MODEL)).num_parameters():,}" in out


def test_convert_roundtrip_through_hf(ckpt, tmp_path, capsys):
    pytest.importorskip("transformers")
    assert main(["convert", str(ckpt), str(tmp_path / "hf"), "--from", "gpt1", "--to", "hf"]) == 0
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--from", "hf"]) == 0
    assert "wrote gpt1 model" in capsys.readouterr().out
    a, b = load_checkpoint(ckpt), load_checkpoint(tmp_path / "back")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_convert_errors_are_one_line(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope"), str(tmp_path / "out"), "--from", "openai"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("gpt1 convert: error:") and "no such folder" in err and "\n" not in err
    (tmp_path / "m").mkdir()
    assert main(["convert", str(tmp_path / "m"), str(tmp_path / "out"), "--from", "openai"]) == 2
    assert "params_shapes.json: missing" in capsys.readouterr().err


def test_sample_prompt_ids_greedy(ckpt, capsys):
    args = [
        "sample",
        str(ckpt),
        "--prompt-ids",
        "1 2 3",
        "--max-new-tokens",
        "7",
        "--temperature",
        "0",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out.split()
    assert len(first) == 10 and first[:3] == ["1", "2", "3"]
    model = load_checkpoint(ckpt).eval()
    from gpt1.inference.generate import generate

    assert [int(t) for t in first] == generate(model, torch.tensor([[1, 2, 3]]), 7, temperature=0)[
        0
    ].tolist()


def test_sample_seeded_num_samples(ckpt, capsys):
    args = [
        "sample",
        str(ckpt),
        "--prompt-ids",
        "5,6",
        "--max-new-tokens",
        "9",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--seed",
        "3",
        "--num-samples",
        "2",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert first.count("=== sample") == 2
    assert main(args) == 0
    assert capsys.readouterr().out == first


def test_sample_text_prompt_needs_tokenizer(ckpt, capsys):
    assert main(["sample", str(ckpt), "--prompt", "hello"]) == 2
    assert "no tokenizer files" in capsys.readouterr().err


def test_sample_bad_option(ckpt, capsys):
    assert main(["sample", str(ckpt), "--prompt-ids", "1 x"]) == 2
    assert "--prompt-ids must be integers" in capsys.readouterr().err
    assert main(["sample", str(ckpt), "--prompt-ids", "1", "--top-p", "2"]) == 2
    assert "--top-p must be a number in (0, 1]" in capsys.readouterr().err


def test_sample_text_prompt_with_gpt1_vocab(gpt1_vocab, tmp_path, capsys):
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{**TINY_MODEL, "vocab_size": 40478}))
    folder = save_model(model, tmp_path / "ck", tokenizer_dir=gpt1_vocab)
    greedy = ["--prompt", "The old man", "--max-new-tokens", "5", "--temperature", "0"]
    assert main(["sample", str(folder), *greedy]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("The old man ") and len(out.split()) >= 4


def test_info_shows_a_finetuned_checkpoints_task(tmp_path, capsys):
    from gpt1.model.heads import FinetuneModel
    from gpt1.recipes.finetune import writer

    gpt = GPT(ModelConfig(**TINY_MODEL))
    classify = gpt.add_tokens(3)[2]
    spec = {"format": "csv", "kind": "single", "columns": {"text": "review", "label": "stars"}}
    spec.update(labels=["bad", "good"], regression=False, positive_label="bad")
    record = {"task": "csv", "kind": "single", "labels": ["bad", "good"], "n_outputs": 2}
    record.update(spec=spec, n_ctx=16, classify_id=classify, question_delimiter=False)
    (tmp_path / "ft").mkdir()
    writer(None, record, {})(FinetuneModel(gpt, "single", 2, classify), tmp_path / "ft")
    assert main(["info", str(tmp_path / "ft")]) == 0
    out = capsys.readouterr().out
    assert "task: csv (single, 2 classes: bad, good)" in out
    assert "F1 of class          bad" in out and "columns              text=review" in out
    assert main(["info", str(tmp_path / "ft"), "--json"]) == 0
    task = json.loads(capsys.readouterr().out)["task"]
    assert task["labels"] == ["bad", "good"] and task["n_ctx"] == 16
    assert task["metrics"] == ["f1", "accuracy", "matthews"] and task["head_parameters"] == 66


def test_an_argument_that_is_not_utf8_is_refused_before_anything_runs(ckpt, tmp_path, capsys):
    # A non-UTF-8 byte in argv reaches Python as a lone surrogate; convert wrote the whole model
    # before safetensors refused the path.
    dst = tmp_path / "out\udcff"
    assert main(["--quiet", "convert", str(ckpt), str(dst), "--from", "gpt1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not valid UTF-8" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_lm_eval_data_that_is_not_a_folder_is_one_line_before_the_harness(ckpt, capsys):
    pytest.importorskip("lm_eval")
    argv = ["--model_args", f"checkpoint={ckpt}", "--tasks", "gpt1_lambada", "--limit", "1"]
    assert main(["--quiet", "lm-eval", *argv, "--data", str(ckpt / "config.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--data must be a folder" in err and len(err.splitlines()) == 1
