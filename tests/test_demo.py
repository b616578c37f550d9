"""`gpt1 demo` end to end at toy size: every step runs through the real commands and the report
names each arm. (The full-size demo's numbers are in docs/results.md.)"""

import json

import pytest

from gpt1.recipes.demo import DemoSettings, demo, format_table


@pytest.mark.slow
def test_demo_pipeline_writes_table_and_report(tmp_path):
    settings = DemoSettings(
        out=tmp_path / "demo",
        merges=200,
        n_layer=1,
        n_embd=32,
        n_head=2,
        n_ctx=32,
        pretrain_steps=6,
        pretrain_batch=4,
        finetune_epochs=0.1,
        finetune_batch=8,
        quiet=True,
    )
    summary = demo(settings)
    out = tmp_path / "demo"
    assert set(summary["results"]) == {
        "pretrained + aux LM (GPT-1)",
        "pretrained, no aux LM",
        "no pretraining",
        "majority class (no model)",
    }
    assert 0.5 <= summary["results"]["majority class (no model)"]["accuracy"] < 1.0
    for res in summary["results"].values():
        assert res["n"] == 360 and 0.0 <= res["accuracy"] <= 1.0
    assert summary["zero_shot"]["n"] == 60
    report = (out / "report.md").read_text()
    assert "no pretraining" in report and "pretrain/loss.png" in report
    # every row by accuracy and F1, the majority class too (F1 alone flatters a model that
    # always answers the positive class)
    assert "| setting | dev accuracy | dev F1 | dev Matthews corr. | n |" in report
    majority = summary["results"]["majority class (no model)"]
    assert f"| majority class (no model) | {majority['accuracy']:.3f} | 0.000 |" in report
    assert "F1 is that of label `1` (*dangerous*" in report
    assert (out / "pretrain" / "loss.png").is_file()
    assert json.loads((out / "demo.json").read_text())["results"] == summary["results"]
    assert "total time" in format_table(summary)

    # re-running continues: every step is already done, nothing is retrained (no file a step
    # wrote is rewritten; only the plots, the report and demo.json are made anew), and the
    # report keeps the times of the run that did the work (not the seconds it took to skip them)
    def step_files() -> dict[str, tuple[int, int]]:
        dirs = ["tokenizer", "prepared", "pretrain", "finetune-0", "finetune-1", "finetune-2"]
        return {
            str(p.relative_to(out)): (p.stat().st_mtime_ns, p.stat().st_size)
            for d in dirs
            for p in (out / d).rglob("*")
            if p.is_file() and p.suffix != ".png"
        }

    before = step_files()
    assert any(k.startswith("pretrain/final/") for k in before)
    again = demo(settings)
    assert again["results"] == summary["results"]
    assert step_files() == before
    assert again["reused_steps"] == list(summary["timings"])
    assert again["timings"] == summary["timings"]
    assert again["seconds"] >= sum(summary["timings"].values())
    assert "Re-run: tokenizer, prepare, pretrain" in (out / "report.md").read_text()


def test_demo_checks_a_user_task_before_running_anything(tmp_path):
    from gpt1.errors import Gpt1Error

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text to pretrain on\n")
    task = tmp_path / "task"
    task.mkdir()
    for split in ("train", "dev"):
        (task / f"{split}.csv").write_text("review,stars\ngood,1\nbad,0\n")
    out = tmp_path / "demo"
    base = dict(out=out, corpus=[str(corpus)], task="csv", data=str(task), quiet=True)
    with pytest.raises(Gpt1Error, match="needs --columns"):
        demo(DemoSettings(**base))
    with pytest.raises(Gpt1Error, match=r"missing column 'text'.*review, stars"):
        demo(DemoSettings(**base, columns="text=text,label=stars"))
    with pytest.raises(Gpt1Error, match="with --corpus"):
        demo(DemoSettings(out=out, task="sst2"))
    assert not out.exists()  # nothing was written, no step ran


def test_table_shows_every_metric_of_every_setting():
    """Accuracy and F1 side by side for every row (a missing one shown as a dash), not the
    headline metric alone: F1 0.571 of a model always answering 1 reads better than the
    majority class's 0.000, its accuracy 0.400 worse than 0.600."""
    run = {"task": "csv", "headline": "f1", "f1_label": "1", "accuracy": 0.4, "f1": 0.5714}
    summary = {
        "results": {"no pretraining": {**run, "n": 20}, "zero-shot": {"accuracy": 0.6, "n": 20}},
        "seconds": 1,
        "report": "r.md",
    }
    lines = format_table(summary).splitlines()
    assert lines[0].split() == ["setting", "accuracy", "F1", "n"]
    assert lines[1].split()[-3:] == ["0.400", "0.571", "20"]
    assert lines[2].split()[-3:] == ["0.600", "–", "20"]
