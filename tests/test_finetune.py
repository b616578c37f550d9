"""Fine-tuning end to end at tiny size on real data (a few dozen examples, a few steps), the
batch source's exact resume, layer transfer, and the commands' results/errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpt1.cli import main
from gpt1.config import FINETUNE_TRAIN, FinetuneConfig, TrainConfig
from gpt1.recipes.evaluate import load_finetuned
from gpt1.recipes.finetune import build_finetune_model, finetune
from gpt1.tasks.batches import Encoded, FinetuneSource
from gpt1.tasks.registry import get_task
from helpers import fault_cases
from helpers.tiny import tiny_finetune

pytestmark = pytest.mark.data
# Two optimizer steps of 4 examples in micro-batches of 2, every step logged.
TWO_STEPS = {"max_steps": 2, "batch_size": 4, "micro_batch_size": 2, "quiet": True, "log_every": 1}


def head_lines(src: Path, dst: Path, n: int) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(src.open(encoding="utf-8").readlines()[:n]), encoding="utf-8")
    return dst


def tiny_run(tmp: Path, vocab: Path, task: str, data: Path, out: str, **ft) -> tuple[dict, Path]:
    cfg = FinetuneConfig(
        task=task, data=str(data), init="none", preset="tiny", vocab=str(vocab), **ft
    )
    train = TrainConfig(**{**FINETUNE_TRAIN, **TWO_STEPS})
    _, results = finetune(cfg, train, tmp / out)
    return results, tmp / out


def test_sst2_finetune_evaluate_predict(tmp_path: Path, shared_data: Path, gpt1_vocab: Path):
    glue = shared_data / "glue" / "SST-2"
    data = tmp_path / "sst2"
    head_lines(glue / "train.tsv", data / "train.tsv", 41)
    head_lines(glue / "dev.tsv", data / "dev.tsv", 25)
    head_lines(glue / "test.tsv", data / "test.tsv", 11)
    results, run = tiny_run(tmp_path, gpt1_vocab, "sst2", data, "run")
    assert results["n"] == 24 and 0.0 <= results["accuracy"] <= 1.0 and results["steps"] == 2
    assert json.loads((run / "results.json").read_text()) == results
    # The saved run reloads to the same predictions (evaluate reproduces the metric).
    code = main(["evaluate", str(run), "--task", "sst2", "--data", str(data), "--json"])
    assert code == 0
    again = json.loads((run / "results.dev.json").read_text())  # results.json stays as it was
    assert again["accuracy"] == results["accuracy"] and again["n"] == 24
    assert json.loads((run / "results.json").read_text()) == results
    assert main(["predict", str(run), "--data", str(data)]) == 0
    rows = (run / "submission" / "SST-2.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 11
    assert {r.split("\t")[1] for r in rows[1:]} <= {"0", "1"}
    # The GPT part is an ordinary checkpoint with the three task tokens.
    model, record, tok = load_finetuned(run)
    assert model.gpt.config.vocab_size == tok.total_size == 40481 and record["kind"] == "single"


def test_story_cloze_multiple_choice(tmp_path: Path, shared_data: Path, gpt1_vocab: Path):
    src = shared_data / "story_cloze" / "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
    data = head_lines(src, tmp_path / "roc.csv", 17)  # a file: used for every split as is
    results, _ = tiny_run(tmp_path, gpt1_vocab, "story_cloze", data, "roc")
    assert results["n"] == 16 and "accuracy" in results


def test_stsb_regression_with_both_orders(tmp_path: Path, shared_data: Path, gpt1_vocab: Path):
    data = tmp_path / "stsb"
    head_lines(shared_data / "glue" / "STS-B" / "train.tsv", data / "train.tsv", 21)
    head_lines(shared_data / "glue" / "STS-B" / "dev.tsv", data / "dev.tsv", 21)
    results, run = tiny_run(tmp_path, gpt1_vocab, "stsb", data, "stsb-run", lm_coef=0.0)
    assert results["n"] == 20 and {"pearson", "spearman"} <= set(results)
    logged = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert logged and all("loss" in r for r in logged if "step" in r)


def test_source_resumes_exactly():
    enc = Encoded([[[i, 1]] for i in range(10)], list(range(10)), [str(i) for i in range(10)])
    a = FinetuneSource(enc, seed=3, regression=False)
    for _ in range(3):
        a.next_batch(4)  # crosses into the second epoch
    b = FinetuneSource(enc, seed=3, regression=False)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for _ in range(4):
        assert torch.equal(a.next_batch(4)["ids"], b.next_batch(4)["ids"])
    first = FinetuneSource(enc, seed=3, regression=False)
    seen = [int(x) for _ in range(5) for x in first.next_batch(2)["ids"][:, 0, 0]]
    assert sorted(seen) == list(range(10))  # one epoch = every example once
    ranks = [FinetuneSource(enc, 3, False, rank=r, world=2) for r in range(2)]
    assert not set(ranks[0]._order) & set(ranks[1]._order)
    # The state carries the examples' digest: other examples refuse it, naming the file; a
    # state without one (an older checkpoint) is taken as it is.
    from gpt1.errors import DataError

    other = Encoded([[[i, 2]] for i in range(10)], list(range(10)), [str(i) for i in range(10)])
    state = a.state_dict()
    with pytest.raises(DataError, match="train.tsv are not those"):
        FinetuneSource(other, 3, False, origin="train.tsv").load_state_dict(state)
    FinetuneSource(other, 3, False).load_state_dict({k: v for k, v in state.items() if k != "data"})


def test_transfer_layers(tmp_path: Path, gpt1_vocab: Path):
    from gpt1.config import model_preset
    from gpt1.model.checkpoint import save_model
    from gpt1.model.gpt import GPT

    torch.manual_seed(0)
    config = model_preset("tiny").derive(vocab_size=40478)
    pre = GPT(config)
    save_model(pre, tmp_path / "ckpt", tokenizer_dir=gpt1_vocab)
    task = get_task("rte")
    for k, emb_same, block0_same, block1_same in [
        (-2, True, True, True),
        (1, True, True, False),
        (0, True, False, False),
        (-1, False, False, False),
    ]:
        cfg = FinetuneConfig(task="rte", data=".", init=str(tmp_path / "ckpt"), transfer_layers=k)
        model, tok, _ = build_finetune_model(cfg, task, seed=5)
        g = model.gpt
        assert torch.equal(g.wte.weight[:40478], pre.wte.weight) == emb_same
        assert torch.equal(g.h[0].attn.c_attn.weight, pre.h[0].attn.c_attn.weight) == block0_same
        assert torch.equal(g.h[1].mlp.c_fc.weight, pre.h[1].mlp.c_fc.weight) == block1_same
        assert g.wte.weight.shape[0] == tok.total_size


def test_cli_bad_row_is_one_line_error(tmp_path: Path, gpt1_vocab: Path, capsys):
    data = tmp_path / "bad"
    data.mkdir()
    (data / "train.tsv").write_text("sentence\tlabel\ngood\t1\nno label here\n")
    args = tiny_finetune(data, gpt1_vocab, tmp_path / "run", 1, task=("--task", "sst2"))
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{data / 'train.tsv'}:3" in err and "expected 2 tab-separated fields" in err


def test_skip_bad_rows_counts_and_reports(tmp_path: Path, shared_data: Path, gpt1_vocab: Path):
    data = tmp_path / "sst2"
    head_lines(shared_data / "glue" / "SST-2" / "dev.tsv", data / "train.tsv", 13)
    with open(data / "train.tsv", "a") as fh:
        fh.write("a row without its label\n")
    head_lines(shared_data / "glue" / "SST-2" / "dev.tsv", data / "dev.tsv", 9)
    results, _ = tiny_run(tmp_path, gpt1_vocab, "sst2", data, "skip", skip_bad_rows=True)
    assert results["train_skipped"] == 1 and results["train_n"] == 12


def test_config_file_and_unknown_keys(tmp_path: Path):
    from gpt1.errors import ConfigError
    from gpt1.recipes.finetune import resolve

    root = Path(__file__).resolve().parents[1]
    cfg, train = resolve(
        root / "configs" / "finetune_scitail.toml",
        {"finetune": {"data": "d", "init": "none", "lm_coef": 0.0}},
    )
    assert (cfg.task, cfg.train_split, cfg.lm_coef, train.lr, train.batch_size) == (
        "scitail",
        "dev",
        0.0,
        6.25e-5,
        32,
    )
    bad = tmp_path / "bad.toml"
    bad.write_text("[finetune]\nlambda = 1\n")
    with pytest.raises(ConfigError, match="unknown key finetune.lambda"):
        resolve(bad, {"finetune": {"data": "d", "init": "none"}})


def _varied(n: int, seed: int = 0) -> Encoded:
    """n single-sequence examples of random lengths 1..40 (token i + 1 repeated: id = example)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 41, (n,), generator=g).tolist()
    return Encoded(
        [[[i + 1] * L] for i, L in enumerate(lengths)], [0] * n, [str(i) for i in range(n)]
    )


def _padding_ratio(batches) -> float:
    padded = sum(b["mask"].numel() for b in batches)
    return padded / sum(float(b["mask"].sum()) for b in batches)


def test_group_by_length_keeps_epochs_whole_cuts_padding_and_resumes(monkeypatch):
    import gpt1.tasks.batches as batches

    monkeypatch.setattr(batches, "GROUP_BATCHES", 10)
    enc = _varied(203)  # 203 % 4 != 0: batches straddle epochs
    grouped = FinetuneSource(enc, seed=1, regression=False, group_by_length=4)
    plain = FinetuneSource(enc, seed=1, regression=False)
    n_batches = 3 * 203 // 4  # three epochs
    g_batches = [grouped.next_batch(4) for _ in range(n_batches)]
    p_batches = [plain.next_batch(4) for _ in range(n_batches)]
    # Every example once per epoch: the first 203 * 3 ids, epoch by epoch.
    seen = [int(row[0, 0]) - 1 for b in g_batches for row in b["ids"]]
    for e in range(2):
        assert sorted(seen[e * 203 : (e + 1) * 203]) == list(range(203))
    # Batches cut where the sorted runs were cut, in every epoch (not only the aligned first).
    assert _padding_ratio(g_batches) < 1.12 < 1.4 < _padding_ratio(p_batches)
    assert grouped.epoch == 2
    # Exact resume mid-epoch, with the grouping.
    again = FinetuneSource(enc, seed=1, regression=False, group_by_length=4)
    for _ in range(60):
        again.next_batch(4)
    resumed = FinetuneSource(enc, seed=1, regression=False, group_by_length=4)
    resumed.load_state_dict(json.loads(json.dumps(again.state_dict())))
    for _ in range(70):
        assert torch.equal(again.next_batch(4)["ids"], resumed.next_batch(4)["ids"])
    from gpt1.errors import ConfigError

    with pytest.raises(ConfigError):
        grouped.next_batch(8)


def test_evaluation_batches_by_length_and_keeps_the_split_order():
    from gpt1.config import model_preset
    from gpt1.inference.prediction import predict_outputs
    from gpt1.model.gpt import GPT
    from gpt1.model.heads import FinetuneModel

    torch.manual_seed(0)
    gpt = GPT(model_preset("tiny"))
    clf = gpt.add_tokens(1)[0]
    model = FinetuneModel(gpt, "single", 1, clf).eval()  # one output: a regression score
    g = torch.Generator().manual_seed(2)
    items = [
        [torch.randint(0, 500, (int(L),), generator=g).tolist() + [clf]]
        for L in torch.randint(1, 30, (23,), generator=g)
    ]
    enc = Encoded(items, [0.0] * 23, [str(i) for i in range(23)])
    task = get_task("stsb")
    batched = predict_outputs(model, task, enc, micro=5)
    alone = [predict_outputs(model, task, Encoded([it], [0.0], ["x"]), micro=1)[0] for it in items]
    assert batched == pytest.approx(alone, abs=1e-5)


def test_log_splits_the_loss_and_names_the_headline_and_f1_class(tmp_path: Path, gpt1_vocab):
    from gpt1.train.telemetry import train_line

    data = tmp_path / "mine"
    data.mkdir()
    rows = "".join(f"{t},{y}\n" for t, y in [("a good film", "yes"), ("a bad film", "no")] * 4)
    (data / "train.csv").write_text("text,ok\n" + rows)
    (data / "dev.csv").write_text("text,ok\n" + rows)
    spec = {"columns": {"text": "text", "label": "ok"}, "positive_label": "no"}
    cfg = FinetuneConfig(
        task="csv", data=str(data), init="none", preset="tiny", vocab=str(gpt1_vocab)
    )
    _, results = finetune(
        cfg, TrainConfig(**{**FINETUNE_TRAIN, **TWO_STEPS}), tmp_path / "run", spec
    )
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in logged if "loss" in r]
    assert len(steps) == 2
    for r in steps:  # the logged loss is task + lm_coef (0.5) x LM, each term logged
        assert r["loss"] == pytest.approx(r["task_loss"] + 0.5 * r["lm_loss"], rel=1e-5)
        assert f"| task {r['task_loss']:.4f} | lm {r['lm_loss']:.4f} |" in train_line(r)
    assert results["headline"] == "f1" and results["f1_label"] == "no"
    record = json.loads((tmp_path / "run" / "final" / "task.json").read_text())
    assert record["spec"]["positive_label"] == "no"  # evaluate scores F1 of the same class


def test_f1_is_of_the_positive_label():
    from gpt1.errors import ConfigError
    from gpt1.tasks.metrics import compute

    preds, gold = [0, 0, 1, 1], [0, 1, 1, 1]
    assert compute(["f1"], preds, gold)["f1"] == pytest.approx(0.8)  # class 1: P 1, R 2/3
    assert compute(["f1"], preds, gold, positive=0)["f1"] == pytest.approx(2 / 3)
    spec = {"columns": {"text": "t", "label": "y"}, "labels": ["neg", "pos"]}
    assert get_task("csv", spec).f1_label == "pos"  # the second class by default
    assert get_task("csv", {**spec, "positive_label": "neg"}).positive_index == 0
    with pytest.raises(ConfigError, match="not one of the classes"):
        get_task("csv", {**spec, "positive_label": "maybe"})
    with pytest.raises(ConfigError, match="only a two-class task"):
        get_task("csv", {**spec, "labels": ["a", "b", "c"], "positive_label": "a"})
    assert get_task("mrpc").f1_label == "1" and get_task("sst2").f1_label is None


def test_positive_label_needs_a_user_task(tmp_path: Path, capsys):
    argv = ["finetune", "--task", "sst2", "--data", str(tmp_path), "--init", "none"]
    assert main([*argv, "--out", str(tmp_path / "r"), "--positive-label", "1"]) == 2
    assert "--positive-label is for csv/tsv/jsonl tasks" in capsys.readouterr().err


# ------------------------------------------------------------------------------- resumes
@pytest.mark.parametrize("name", fault_cases.refused_resumes("finetune"))
def test_resume_refuses_a_setting_that_changes_the_run(resume_work, name):
    """Task, data, labels, lr, batch and seed cannot change on --resume: one line naming the
    setting and both values; run.json, task.json and the checkpoints stay as they were."""
    assert fault_cases.resume_refused(resume_work, name) == []


def test_resume_after_a_training_row_was_edited_is_refused(tmp_path):
    assert fault_cases.resume_on_edited_examples(tmp_path) == []


def test_a_finished_run_resumed_again_changes_nothing(resume_work):
    assert fault_cases.resume_of_a_finished_run(resume_work, "finetune") == []


def test_resume_accepts_more_steps_and_records_them(resume_work):
    assert fault_cases.resume_accepts(resume_work, "finetune") == []
    run = json.loads((resume_work / "accepted-finetune" / "run.json").read_text())
    assert run["train"]["max_steps"] == 4 and run["resumes"][0]["step"] == 2
