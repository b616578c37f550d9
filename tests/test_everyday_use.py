"""Rough edges a new user meets: one device/precision spelling, commands that say where they
wrote, help and common options on every subcommand, prediction without labels."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import pytest
import torch
from conftest import SHARED_DATA

from gpt1.cli import main
from gpt1.config import TrainConfig
from gpt1.devices import resolve_device, resolve_precision
from gpt1.errors import ConfigError
from helpers.tiny import tiny_finetune


def test_auto_device_and_precision():
    cpu = torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == cpu
    assert resolve_precision("auto", cpu) == "fp32"
    assert resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ConfigError, match="precision must be one of"):
        resolve_precision("fp8", cpu)
    with pytest.raises(ConfigError, match="unknown device|unsupported device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda:0")
    assert TrainConfig().precision == "auto" and TrainConfig().device == "auto"
    TrainConfig(device="cuda:1", precision="bf16")  # valid spellings
    with pytest.raises(ConfigError, match="train.device"):
        TrainConfig(device="gpu")


def test_training_device_is_the_local_ranks_gpu(monkeypatch):
    """Under torchrun each training process takes the GPU of its local rank; cuda:N stays N."""
    cpu = torch.device("cpu")
    assert resolve_device("cpu", local_rank=3) == cpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", local_rank=1) == cpu
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve_device("cuda", local_rank=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert resolve_device("auto", local_rank=2) == torch.device("cuda", 2)
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda", 3)
    assert resolve_device("cuda:1", local_rank=3) == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ConfigError, match="only 4 CUDA device"):
        resolve_device("cuda", local_rank=4)


def test_pretrain_and_finetune_take_device(tmp_path, capsys):
    for command in (
        ["pretrain", "--data", str(tmp_path)],
        ["finetune", "--task", "sst2", "--data", str(tmp_path), "--init", "none"],
    ):
        assert main([*command, "--out", str(tmp_path / "run"), "--device", "gpu"]) == 2
        assert (
            "train.device must be auto, cpu, cuda or cuda:N, got 'gpu'" in capsys.readouterr().err
        )
    assert not (tmp_path / "run").exists()


def test_zeroshot_dtype_is_a_hidden_alias_of_precision(capsys):
    from gpt1.cli.zeroshot import _precision

    ns = lambda **kw: argparse.Namespace(**{"precision": None, "dtype": None, **kw})  # noqa: E731
    assert _precision(ns()) == "auto"
    assert _precision(ns(precision="bf16")) == "bf16"
    assert _precision(ns(dtype="fp16")) == "fp16"
    with pytest.raises(ConfigError, match="disagree"):
        _precision(ns(precision="fp32", dtype="bf16"))
    with pytest.raises(SystemExit):
        main(["zeroshot", "--help"])
    out = capsys.readouterr().out
    assert "--precision" in out and "--dtype" not in out


@pytest.mark.parametrize("action", ["encode", "decode", "train"])
def test_tokenizer_subcommands_have_descriptions_and_common_options(action, capsys):
    with pytest.raises(SystemExit):
        main(["tokenizer", action, "--help"])
    out = capsys.readouterr().out
    assert "--debug" in out and "--quiet" in out and "Example:" in out


def test_tokenizer_quiet_after_the_subcommand(gpt1_vocab, monkeypatch, capsys):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello world\n")))
    assert main(["tokenizer", "encode", "--vocab", str(gpt1_vocab), "--quiet"]) == 0
    assert capsys.readouterr().out.split() == ["3570", "1276"]


def test_evaluate_split_help_states_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert "dev (default)" in capsys.readouterr().out


def write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    path.write_text("sentence,label\n" + "".join(f"{s},{y}\n" for s, y in rows))


def csv_finetune(data: Path, vocab: Path, run: Path, *extra: str) -> list[str]:
    """`gpt1 finetune` for one step of the tiny model on a `write_csv` task (sentence, label)
    in one batch of 4, on the CPU."""
    task = ("--task", "csv", "--columns", "text=sentence,label=label")
    flags = ("--micro-batch", "4", "--device", "cpu", "-q", *extra)
    return tiny_finetune(data, vocab, run, 1, *flags, task=task)


@pytest.mark.data
def test_finetune_evaluate_print_where_they_wrote_and_predict_needs_no_labels(
    tmp_path, gpt1_vocab, capsys
):
    data = tmp_path / "task"
    data.mkdir()
    write_csv(data / "train.csv", [("a good film", "pos"), ("a bad film", "neg")] * 4)
    # dev holds a gold label never seen in training: evaluation cannot score it, prediction can
    write_csv(data / "dev.csv", [("a fine film", "pos"), ("an odd film", "meh")])
    run = tmp_path / "run"
    assert main(csv_finetune(data, gpt1_vocab, run, "--eval-split", "train")) == 0
    out = capsys.readouterr().out
    assert f"wrote {run / 'final'} (fine-tuned model), {run / 'results.json'}" in out
    assert main(["evaluate", str(run), "--data", str(data), "--split", "train"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"wrote {run / 'results.train.json'}"
    assert main(["predict", str(run), "--data", str(data), "--split", "dev"]) == 0
    written = Path(capsys.readouterr().out.strip())
    rows = written.read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 3
    assert {r.split("\t")[1] for r in rows[1:]} <= {"neg", "pos"}
    # evaluation does need the labels, and says which one it does not know
    assert main(["evaluate", str(run), "--data", str(data), "--split", "dev"]) == 2
    assert "unknown label 'meh'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_csv_run(tmp_path_factory):
    """A one-step csv classifier (labels neg/pos) and its data folder, shared by the module's
    tests (each writes under its own names)."""
    gpt1_vocab = SHARED_DATA / "gpt1_tokenizer"
    if not gpt1_vocab.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set GPT1_SHARED_DATA)")
    tmp_path = tmp_path_factory.mktemp("csv_run")
    data = tmp_path / "task"
    data.mkdir()
    write_csv(data / "train.csv", [("a good film", "pos"), ("a bad film", "neg")] * 4)
    write_csv(data / "dev.csv", [("a fine film", "pos"), ("a dull film", "neg")])
    run = tmp_path / "run"
    assert main(csv_finetune(data, gpt1_vocab, run)) == 0
    return run, data


@pytest.mark.data
def test_evaluate_and_predict_take_any_split_name_or_a_file(tiny_csv_run, tmp_path, capsys):
    run, data = tiny_csv_run
    held_out = tmp_path / "held_out.csv"
    write_csv(held_out, [("a great film", "pos"), ("a poor film", "neg"), ("so so", "neg")])
    assert main(["evaluate", str(run), "--file", str(held_out), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["split"] == "held_out" and scored["n"] == 3
    assert json.loads((run / "results.held_out.json").read_text()) == scored
    # a split name of the user's own is looked up in the data folder like train/dev/test
    (data / "extra.csv").write_text(held_out.read_text())
    assert main(["evaluate", str(run), "--data", str(data), "--split", "extra", "--json"]) == 0
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["n"] == 3 and again["accuracy"] == scored["accuracy"]
    assert main(["predict", str(run), "--file", str(held_out)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "submission" / "csv.held_out.tsv")
    # a name that would reach outside the data folder, and both sources at once, are refused
    assert main(["evaluate", str(run), "--data", str(data), "--split", "../x"]) == 2
    assert "split name '../x'" in capsys.readouterr().err
    assert main(["predict", str(run), "--data", str(data), "--file", str(held_out)]) == 2
    assert "either --data" in capsys.readouterr().err
    assert main(["evaluate", str(run), "--file", str(tmp_path / "nope.csv")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.data
def test_predict_writes_jsonl_and_csv_with_inputs_labels_and_probabilities(
    tiny_csv_run, tmp_path, capsys
):
    import csv

    run, data = tiny_csv_run
    held_out = tmp_path / "scored_later.csv"
    held_out.write_text('sentence,label\n"a great, long film",pos\nunlabelled one,\n')
    assert main(["predict", str(run), "--file", str(held_out), "--format", "jsonl"]) == 0
    path = run / "predictions" / "scored_later.jsonl"
    assert capsys.readouterr().out.strip() == str(path)
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["text"] for r in recs] == ["a great, long film", "unlabelled one"]
    assert recs[0]["gold"] == "pos" and "gold" not in recs[1]
    for r in recs:
        probs = r["probabilities"]
        assert set(probs) == {"neg", "pos"} and sum(probs.values()) == pytest.approx(1.0)
        assert r["label"] == max(probs, key=probs.get)
    # the TSV submission predicts the same labels
    assert main(["predict", str(run), "--file", str(held_out)]) == 0
    tsv = (run / "submission" / "csv.scored_later.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[1] for row in tsv] == [r["label"] for r in recs]
    assert main(["predict", str(run), "--file", str(held_out), "--format", "csv"]) == 0
    with open(run / "predictions" / "scored_later.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == [
        "id",
        "text",
        "label",
        "label_name",
        "gold",
        "gold_name",
        "p_neg",
        "p_pos",
    ]
    assert rows[0]["text"] == "a great, long film" and rows[1]["gold"] == ""
    assert float(rows[1]["p_pos"]) == pytest.approx(recs[1]["probabilities"]["pos"])
    # an existing prediction file is kept unless --overwrite
    assert main(["predict", str(run), "--file", str(held_out), "--format", "csv"]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.data
def test_a_file_named_like_a_multi_file_split_is_read_once(
    tmp_path, shared_data, gpt1_vocab, capsys
):
    """`--file dev.tsv` of an MNLI run is that file, not MNLI's two dev sets read from it."""
    from gpt1 import GPT, ModelConfig
    from gpt1.model.heads import FinetuneModel
    from gpt1.recipes.finetune import writer
    from gpt1.tasks.nli import NLI_LABELS

    torch.manual_seed(0)
    gpt = GPT(ModelConfig(vocab_size=40478, n_positions=128, n_embd=16, n_layer=1, n_head=2))
    classify = gpt.add_tokens(3)[2]
    record = {"task": "mnli", "kind": "pair", "labels": NLI_LABELS, "n_outputs": 3}
    record.update(n_ctx=128, classify_id=classify, question_delimiter=False)
    (tmp_path / "run").mkdir()
    writer(gpt1_vocab, record, {})(FinetuneModel(gpt, "pair", 3, classify), tmp_path / "run")
    src = shared_data / "glue_kshot_samples" / "MNLI" / "16-42" / "dev_matched.tsv"
    dev = tmp_path / "dev.tsv"
    dev.write_text("".join(src.open(encoding="utf-8").readlines()[:4]), encoding="utf-8")
    run = str(tmp_path / "run")
    assert main(["evaluate", run, "--file", str(dev), "--device", "cpu", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert scored["split"] == "dev" and scored["n"] == 3
    assert "dev_matched" not in scored and "dev_mismatched" not in scored
    assert main(["predict", run, "--file", str(dev), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "run" / "submission" / "mnli.dev.tsv")
    ]


def test_csv_cells_a_spreadsheet_would_run_are_neutralised():
    """OWASP's rule: text starting with = + - @ tab or CR gets a quote; numbers stay numbers."""
    from gpt1.recipes.predictions import to_csv

    recs = [
        {"id": "=1+1", "text": t, "label": "-1", "probabilities": {"-1": 0.25, "+1": 0.75}}
        for t in ('=HYPERLINK("http://x")', "+1+2", "-2+3", "@SUM(A1)", "\tx", "\rx", "fine")
    ]
    rows = list(csv.reader(io.StringIO(to_csv(recs), newline="")))
    assert rows[0] == ["id", "text", "label", "p_-1", "p_+1"]
    texts = [row[1] for row in rows[1:]]
    assert texts == [
        '\'=HYPERLINK("http://x")',
        "'+1+2",
        "'-2+3",
        "'@SUM(A1)",
        "'\tx",
        "'\rx",
        "fine",
    ]
    assert all(row[0] == "'=1+1" and row[2] == "-1" for row in rows[1:])  # -1 is a number
    raw = list(csv.reader(io.StringIO(to_csv(recs, raw=True), newline="")))[1:]
    assert [row[1] for row in raw] == [r["text"] for r in recs] and raw[0][0] == "=1+1"


@pytest.mark.data
def test_predict_csv_neutralises_formulas_unless_raw(tiny_csv_run, tmp_path, capsys):
    run, _ = tiny_csv_run
    held_out = tmp_path / "formulas.csv"
    held_out.write_text("sentence,label\n\"=cmd|' /C calc'!A0\",pos\n@SUM(1),neg\n")
    common = ["predict", str(run), "--file", str(held_out), "--out", str(tmp_path / "p")]
    assert main([*common, "--format", "csv"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "p" / "formulas.csv", newline="")))
    assert [r["text"] for r in rows] == ["'=cmd|' /C calc'!A0", "'@SUM(1)"]
    assert main([*common, "--format", "csv", "--raw-csv", "--overwrite"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "p" / "formulas.csv", newline="")))
    assert [r["text"] for r in rows] == ["=cmd|' /C calc'!A0", "@SUM(1)"]
    assert main([*common, "--format", "jsonl"]) == 0  # JSONL stays raw
    recs = [json.loads(x) for x in (tmp_path / "p" / "formulas.jsonl").read_text().splitlines()]
    assert recs[1]["text"] == "@SUM(1)"
    assert main([*common, "--raw-csv"]) == 2
    assert "--raw-csv applies to --format csv only" in capsys.readouterr().err
