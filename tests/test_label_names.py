"""Class names a person reads: GLUE tasks whose labels are digits name their classes in the task
table; `gpt1 predict`'s JSONL/CSV and `/v1/predict` show the name beside the raw label, while
the GLUE submission TSV keeps the raw labels the GLUE server reads."""

from __future__ import annotations

import csv
import io
import json

import pytest

from gpt1.cli import main
from gpt1.tasks.registry import get_task
from helpers.tiny import char_vocab

NAMES = {
    "sst2": ["negative", "positive"],
    "cola": ["unacceptable", "acceptable"],
    "mrpc": ["not_equivalent", "equivalent"],
    "qqp": ["not_duplicate", "duplicate"],
    "wnli": ["not_entailment", "entailment"],
    "qnli": ["entailment", "not_entailment"],  # already words: the name is the label
    "rte": ["entailment", "not_entailment"],
    "mnli": ["entailment", "neutral", "contradiction"],
}


@pytest.mark.parametrize("name", NAMES)
def test_task_table_names_each_class(name):
    task = get_task(name)
    assert [task.label_name(i) for i in range(len(task.labels))] == NAMES[name]


@pytest.fixture(scope="module")
def sst2(tmp_path_factory):
    """A tiny random SST-2 run and a dev file with gold labels."""
    pytest.importorskip("fastapi")
    from test_serve import SENTENCES, tiny_run, write_rows

    root = tmp_path_factory.mktemp("names")
    run = tiny_run(root / "run", char_vocab(root / "vocab"), "sst2")
    rows = [{"sentence": s, "label": i % 2} for i, s in enumerate(SENTENCES)]
    write_rows(root / "data" / "dev.tsv", rows, "tsv")
    return run, root / "data", rows


def predict(run, data, out, fmt):
    argv = ["--quiet", "predict", str(run), "--data", str(data), "--split", "dev"]
    assert main([*argv, "--format", fmt, "--out", str(out)]) == 0
    (path,) = out.glob(f"*.{fmt}")
    return path.read_text()


def test_predict_files_show_names_beside_raw_labels(sst2, tmp_path):
    run, data, rows = sst2
    names = dict(zip(["0", "1"], NAMES["sst2"]))
    records = [
        json.loads(line) for line in predict(run, data, tmp_path / "j", "jsonl").splitlines()
    ]
    for rec, row in zip(records, rows, strict=True):
        assert rec["label"] in names and rec["label_name"] == names[rec["label"]]
        assert rec["gold"] == str(row["label"]) and rec["gold_name"] == names[rec["gold"]]
        assert set(rec["probabilities"]) == {"0", "1"}  # keyed by raw label, as before
    table = list(csv.DictReader(io.StringIO(predict(run, data, tmp_path / "c", "csv"))))
    assert list(table[0]) == "id text label label_name gold gold_name p_0 p_1".split()
    assert [(r["label"], r["label_name"]) for r in table] == [
        (r["label"], r["label_name"]) for r in records
    ]
    # The submission TSV: raw labels only, exactly `index<TAB>prediction` lines.
    tsv = predict(run, data, tmp_path / "t", "tsv")
    assert tsv == "index\tprediction\n" + "".join(f"{r['id']}\t{r['label']}\n" for r in records)


def test_v1_predict_answers_label_name(sst2):
    from test_serve import post, serving

    run, _, rows = sst2
    with serving(run) as url:
        answer = post(f"{url}/v1/predict", {"inputs": [{"text": r["sentence"]} for r in rows]})
    assert answer.status_code == 200, answer.text
    names = dict(zip(["0", "1"], NAMES["sst2"]))
    for p in answer.json()["predictions"]:
        assert list(p) == ["label", "label_name", "probabilities"]
        assert p["label_name"] == names[p["label"]] and set(p["probabilities"]) == {"0", "1"}
