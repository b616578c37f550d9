"""Readers: every format against the real files in ../shared/data, and the documented formats
(RTE, MRPC, WNLI, QQP, MNLI, RACE, generic) on small files written here; bad rows."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from gpt1.errors import ConfigError, DataError
from gpt1.tasks.examples import ChoiceExample, TextExample, UnknownLabelError
from gpt1.tasks.registry import complete_generic_spec, get_task


def counts(split):
    return Counter(e.label for e in split.examples)


# ------------------------------------------------------------------ real data
@pytest.mark.data
def test_glue_real_files(shared_data: Path):
    glue = shared_data / "glue"
    cola = get_task("cola")
    assert [len(cola.read(glue / "CoLA", s)) for s in ("train", "dev", "test")] == [
        8551,
        1043,
        1063,
    ]
    first = cola.read(glue / "CoLA", "train").examples[0]
    assert first.text.startswith("Our friends won't buy this analysis") and first.label == 1
    sst = get_task("sst2").read(glue / "SST-2", "dev")
    assert counts(sst) == {1: 444, 0: 428}
    assert get_task("sst2").read(glue / "SST-2", "test").examples[0].label is None
    stsb = get_task("stsb").read(glue / "STS-B", "train")
    assert len(stsb) == 5749 and stsb.examples[1].label == pytest.approx(3.8)
    assert stsb.examples[1].b == "A man is playing a flute."
    qnli = get_task("qnli").read(glue / "QNLI", "dev")
    assert counts(qnli) == {0: 2702, 1: 2761}
    assert qnli.examples[0].a.startswith("What came into force")  # question first


@pytest.mark.data
def test_nli_real_files(shared_data: Path):
    snli = get_task("snli")
    test = snli.read(shared_data / "snli", "test")
    assert counts(test) == {0: 3368, 1: 3219, 2: 3237}
    assert len(snli.read(shared_data / "snli", "dev")) == 9842
    assert not test.examples[0].a.endswith(" ")  # the files' trailing space is stripped
    fooler = snli.read(shared_data / "nli_samples_textfooler", "test")
    assert counts(fooler) == {0: 367, 1: 322, 2: 311}
    mnli = get_task("mnli")
    mm = mnli.read(shared_data / "nli_samples_textfooler", "dev_mismatched")
    assert counts(mm) == {0: 346, 1: 319, 2: 335}
    kshot = shared_data / "glue_kshot_samples"
    assert len(mnli.read(kshot / "MNLI" / "16-42", "train")) == 48
    # GLUE-style SNLI rows with five annotator labels: the gold label is the last field.
    dev = snli.read(kshot / "SNLI" / "16-42", "dev")
    assert len(dev) == 48 and set(counts(dev)) == {0, 1, 2}
    assert len(get_task("qqp").read(kshot / "QQP" / "16-42", "train")) == 32
    sci = get_task("scitail")
    assert counts(sci.read(shared_data / "scitail", "dev")) == {0: 657, 1: 647}
    assert counts(sci.read(shared_data / "scitail", "test")) == {0: 842, 1: 1284}


@pytest.mark.data
def test_story_cloze_split(shared_data: Path):
    task = get_task("story_cloze")
    train = task.read(shared_data / "story_cloze", "train")
    dev = task.read(shared_data / "story_cloze", "dev")
    test = task.read(shared_data / "story_cloze", "test")
    assert (len(train), len(dev), len(test)) == (1497, 374, 1871)
    assert not {e.uid for e in train.examples} & {e.uid for e in dev.examples}
    assert counts(test) == {0: 960, 1: 911}
    ex = test.examples[0]
    assert isinstance(ex, ChoiceExample) and len(ex.choices) == 2 and ex.question == ""
    assert ex.context.startswith("My friends all love to go to the club to dance. They think")


# ------------------------------------------------------- documented formats
def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_rte_wnli_qqp_mrpc(tmp_path: Path):
    write(
        tmp_path / "rte" / "train.tsv",
        "index\tsentence1\tsentence2\tlabel\n"
        "0\tA man sleeps.\tSomeone sleeps.\tentailment\n1\tA\tB\tnot_entailment\n",
    )
    rte = get_task("rte").read(tmp_path / "rte", "train")
    assert [e.label for e in rte.examples] == [0, 1] and rte.examples[0].b == "Someone sleeps."
    write(tmp_path / "wnli" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tx\ty\t1\n")
    assert get_task("wnli").read(tmp_path / "wnli", "dev").examples[0].label == 1
    write(tmp_path / "qqp" / "test.tsv", "id\tquestion1\tquestion2\n7\tWhy?\tHow?\n")
    ex = get_task("qqp").read(tmp_path / "qqp", "test").examples[0]
    assert (ex.a, ex.b, ex.label, ex.uid) == ("Why?", "How?", None, "7")
    write(
        tmp_path / "mrpc" / "train.tsv",
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        '1\t702876\t702977\tAmrozi accused "his brother\tReferring to him\n',
    )
    ex = get_task("mrpc").read(tmp_path / "mrpc", "train").examples[0]
    assert ex.a == 'Amrozi accused "his brother' and ex.label == 1  # quotes are plain text


def test_mnli_glue_dev_with_annotator_labels(tmp_path: Path):
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
    write(
        tmp_path / "dev_matched.tsv",
        header + "0\t1\t1e\tfiction\tP one.\tH one.\tneutral\tneutral\tneutral\tcontradiction\n"
        "1\t2\t2e\tfiction\tP two.\tH two.\tneutral\t-\n",
    )
    split = get_task("mnli").read(tmp_path, "dev_matched")
    assert [e.label for e in split.examples] == [2] and split.dropped == 1
    assert get_task("mnli").resolve_splits("dev") == ("dev_matched", "dev_mismatched")


def test_race_folder_and_levels(tmp_path: Path):
    doc = {
        "article": "Tom has a cat.",
        "questions": ["What does Tom have?", "Who _ a cat?"],
        "options": [["a dog", "a cat", "a cow", "a hen"], ["Tom has", "Ann", "Bo", "Al"]],
        "answers": ["B", "A"],
        "id": "middle1.txt",
    }
    for name in ("2.txt", "10.txt"):
        write(tmp_path / "RACE" / "dev" / "middle" / name, json.dumps(doc))
    write(tmp_path / "RACE" / "dev" / "high" / "1.txt", json.dumps(dict(doc, answers=["C", "D"])))
    both = get_task("race").read(tmp_path, "dev")
    assert len(both) == 6 and [e.label for e in both.examples] == [1, 0, 1, 0, 2, 3]
    assert both.examples[0].question == "What does Tom have?"
    assert len(get_task("race_high").read(tmp_path, "dev")) == 2
    write(tmp_path / "RACE" / "dev" / "middle" / "3.txt", json.dumps(dict(doc, answers=["B", "E"])))
    with pytest.raises(DataError, match=r"3\.txt.*answers\[1\]"):
        get_task("race_middle").read(tmp_path, "dev")


def test_race_question_with_another_number_of_options_names_its_file_and_line(tmp_path: Path):
    """A split's choices are scored as one softmax, so every question has as many options as
    the first: the refusal names the file (folder form) or the line (jsonl form) that differs."""
    doc = {
        "article": "Tom has a cat.",
        "questions": ["What does Tom have?", "Who has a cat?"],
        "options": [["a dog", "a cat", "a cow", "a hen"], ["Tom", "Ann", "Bo"]],
        "answers": ["B", "A"],
    }
    write(tmp_path / "RACE" / "dev" / "middle" / "7.txt", json.dumps(doc))
    with pytest.raises(DataError, match=r"7\.txt.*options\[1\].*3 options where 7\.txt has 4"):
        get_task("race_middle").read(tmp_path, "dev")
    lines = [
        {"article": "A.", "question": "Q?", "options": ["a", "b", "c", "d"], "answer": "A"},
        {"article": "B.", "question": "Q?", "options": ["a", "b"], "answer": "B"},
    ]
    write(tmp_path / "race.jsonl" / "dev.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(DataError, match=r"dev\.jsonl.*2.*options.*line 1 has 4"):
        get_task("race").read(tmp_path / "race.jsonl", "dev")


def test_generic_csv_and_jsonl(tmp_path: Path):
    write(tmp_path / "train.csv", 'id,review,stars\n1,"good, really",pos\n2,bad,neg\n3,ok,pos\n')
    spec = complete_generic_spec(
        "csv", {"columns": {"text": "review", "label": "stars", "id": "id"}}, tmp_path, "train"
    )
    task = get_task("csv", spec)
    assert task.kind == "single" and task.labels == ["neg", "pos"]
    split = task.read(tmp_path, "train")
    assert split.examples[0] == TextExample("good, really", 1, "1")
    write(
        tmp_path / "train.jsonl", json.dumps({"ctx": "c", "opts": ["x", "y", "z"], "y": "2"}) + "\n"
    )
    task = get_task(
        "jsonl",
        {"columns": {"context": "ctx", "choices": "opts", "label": "y"}, "labels": ["0", "1", "2"]},
    )
    ex = task.read(tmp_path, "train").examples[0]
    assert task.kind == "choice" and ex.choices == ["x", "y", "z"] and ex.label == 2
    with pytest.raises(ConfigError, match="unknown role"):
        get_task("csv", {"columns": {"txt": "review"}})
    # A role given twice, or the label column also read as an input, is refused.
    from gpt1.tasks.generic import parse_columns

    with pytest.raises(ConfigError, match="text given twice"):
        parse_columns("text=review,text=stars,label=stars")
    for columns in (
        {"text": "stars", "label": "stars"},
        {"a": "x", "b": "stars", "label": "stars"},
    ):
        with pytest.raises(ConfigError, match="'stars' is both the label and an input"):
            get_task("csv", {"columns": columns})
    with pytest.raises(ConfigError, match="both the label and an input .choices."):
        get_task("jsonl", {"columns": {"context": "c", "choices": "x|y", "label": "y"}})


# ------------------------------------------------------------------ bad input
def read_error(folder: Path, task: str, split: str) -> DataError:
    """The error that reading `split` of `task` from `folder` raises."""
    with pytest.raises(DataError) as err:
        get_task(task).read(folder, split)
    return err.value


def test_bad_row_names_file_line_and_skip(tmp_path: Path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\ngood\t1\nbroken row\nfine\t0\n")
    err = read_error(tmp_path, "sst2", "train")
    assert err.line == 3 and Path(err.path) == path
    assert f"{path}:3" in str(err) and "expected 2 tab-separated fields" in str(err)
    split = get_task("sst2").read(tmp_path, "train", skip_bad_rows=True)
    assert len(split) == 2 and [e.line for e in split.skipped] == [3]


def test_empty_text_and_bad_score_name_the_field(tmp_path: Path):
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    )
    write(
        tmp_path / "train.tsv",
        header + "0\tg\tf\ty\t0\tn\tn\tA\tB\t4.2\n1\tg\tf\ty\t0\tn\tn\tA\tB\tfive\n",
    )
    err = read_error(tmp_path, "stsb", "train")
    assert (err.line, err.field) == (3, "score")
    write(tmp_path / "dev.tsv", "sentence\tlabel\n \t1\n")
    err = read_error(tmp_path, "sst2", "dev")
    assert (err.line, err.field) == (2, "sentence")


def test_unknown_label_is_an_error_even_when_skipping(tmp_path: Path):
    write(
        tmp_path / "train.tsv",
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tmaybe\n",
    )
    with pytest.raises(UnknownLabelError, match=r"train\.tsv:3.*unknown label 'maybe'") as caught:
        get_task("rte").read(tmp_path, "train", skip_bad_rows=True)
    # The message says why --skip-bad-rows did not skip it (its help and docs say so too).
    assert "never a label outside the task's set" in str(caught.value)
    assert (caught.value.line, caught.value.field) == (3, "label")
    with pytest.raises(UnknownLabelError) as plain:
        get_task("rte").read(tmp_path, "train")
    assert "--skip-bad-rows" not in str(plain.value)


def test_empty_split_is_an_error(tmp_path: Path):
    write(tmp_path / "train.tsv", "sentence\tlabel\n")
    with pytest.raises(DataError, match="empty"):
        get_task("sst2").read(tmp_path, "train")
    write(tmp_path / "dev.tsv", "sentence\tlabel\nonly bad\n")
    with pytest.raises(DataError, match="1 malformed rows skipped"):
        get_task("sst2").read(tmp_path, "dev", skip_bad_rows=True)
    with pytest.raises(DataError, match="no file for split 'test'"):
        get_task("sst2").read(tmp_path, "test")


def test_csv_line_numbers_count_quoted_newlines(tmp_path: Path):
    head = (
        "InputStoryid,InputSentence1,InputSentence2,InputSentence3,InputSentence4,"
        "RandomFifthSentenceQuiz1,RandomFifthSentenceQuiz2,AnswerRightEnding\n"
    )
    write(
        tmp_path / "cloze_test_test__spring2016 - cloze_test_ALL_test.csv",
        head + 'a,"one\ntwo",s2,s3,s4,e1,e2,1\nb,s1,s2,s3,s4,e1,e2\n',
    )
    err = read_error(tmp_path, "story_cloze", "test")
    assert err.line == 4  # the second record starts on line 4 (the first spans 2-3)


def test_csv_quoted_fields_keep_their_line_breaks(tmp_path: Path):
    """RFC 4180: a line break inside quotes is part of the field (it separates two words; the
    text pipeline later treats it as whitespace), in LF, CRLF and lone-CR files alike."""
    from gpt1.tasks.examples import BadRows
    from gpt1.tasks.rows import csv_records

    for end in ("\n", "\r\n", "\r"):
        path = tmp_path / f"t{len(end)}.csv"
        path.write_bytes(
            f'review,stars{end}"first line{end}second line",pos{end}plain,neg{end}'.encode()
        )
        records = list(csv_records(path, BadRows()))
        assert records == [
            (2, {"review": f"first line{end}second line", "stars": "pos"}),
            (4, {"review": "plain", "stars": "neg"}),
        ]


@pytest.mark.parametrize("name", ["train.csv", "train.tsv", "train.jsonl"])
def test_lone_cr_line_endings_are_line_endings(tmp_path: Path, name):
    """A spreadsheet's "CSV (Macintosh)" ends its lines in a lone CR: read line by line."""
    rows = {
        "train.csv": ["text,label", "good film,pos", "bad film,neg"],
        "train.tsv": ["text\tlabel", "good film\tpos", "bad film\tneg"],
        "train.jsonl": [json.dumps({"text": t, "label": l}) for t, l in (("good", "pos"),)],
    }[name]
    (tmp_path / name).write_bytes(("\ufeff" + "\r".join(rows) + "\r").encode())
    spec = {"columns": {"text": "text", "label": "label"}, "labels": ["neg", "pos"]}
    split = get_task(name.split(".")[1], spec).read(tmp_path, "train")
    assert [e.label for e in split.examples] == [1, 0][: len(rows) - (name != "train.jsonl")]
    assert all("\r" not in e.text for e in split.examples)


@pytest.mark.parametrize("name", ["dev.csv", "dev.tsv"])
def test_a_stray_cr_outside_quotes_is_a_bad_row(tmp_path: Path, name):
    sep = "," if name.endswith(".csv") else "\t"
    lines = [f"text{sep}label", f"good{sep}pos", f"bad\rfilm{sep}neg", f"fine{sep}pos", ""]
    (tmp_path / name).write_bytes("\n".join(lines).encode())
    spec = {"columns": {"text": "text", "label": "label"}, "labels": ["neg", "pos"]}
    task = get_task(name.split(".")[1], spec)
    with pytest.raises(DataError, match="carriage return") as err:
        task.read(tmp_path, "dev")
    assert err.value.line == 3 and name in str(err.value)
    split = task.read(tmp_path, "dev", skip_bad_rows=True)
    assert [e.text for e in split.examples] == ["good", "fine"]
    assert [e.line for e in split.skipped] == [3]


def test_finetune_reads_a_lone_cr_csv(tmp_path: Path):
    from helpers.tiny import char_vocab, make_task, run_cli, tiny_finetune

    task = make_task(tmp_path / "task")
    for split in ("train", "dev"):
        tsv = (task / f"{split}.tsv").read_text()
        (task / f"{split}.csv").write_bytes(tsv.replace("\t", ",").replace("\n", "\r").encode())
        (task / f"{split}.tsv").unlink()
    csv_task = ("--task", "csv", "--columns", "text=text,label=label", "--labels", "neg,pos")
    argv = tiny_finetune(task, char_vocab(tmp_path / "vocab"), tmp_path / "ft", 1, task=csv_task)
    code, err = run_cli(argv)
    assert code == 0, err


def test_crlf_bom_and_invalid_utf8(tmp_path: Path):
    (tmp_path / "train.tsv").write_bytes(b"\xef\xbb\xbfsentence\tlabel\r\nnice\t1\r\n")
    ex = get_task("sst2").read(tmp_path, "train").examples[0]
    assert (ex.text, ex.label) == ("nice", 1)
    (tmp_path / "dev.tsv").write_bytes(b"sentence\tlabel\nok\t1\nbad \xff\t0\n")
    err = read_error(tmp_path, "sst2", "dev")
    assert err.line == 3 and "UTF-8" in str(err)


def test_parallel_files_of_different_length(tmp_path: Path):
    write(tmp_path / "s1.dev", "a .\nb .\n")
    write(tmp_path / "s2.dev", "c .\n")
    write(tmp_path / "labels.dev", "neutral\nentailment\n")
    with pytest.raises(DataError, match=r"s2\.dev.*same number of lines"):
        get_task("snli").read(tmp_path, "dev")


def test_unknown_task_and_any_split_name(tmp_path: Path):
    with pytest.raises(ConfigError, match="unknown task"):
        get_task("imdb")
    # any split name is a file name to look for, like the task's own splits
    write(tmp_path / "validation.tsv", "sentence\tlabel\nfine\t1\n")
    assert len(get_task("sst2").read(tmp_path, "validation")) == 1
    with pytest.raises(DataError, match=r"no file for split 'held_out' \(looked for held_out.tsv"):
        get_task("sst2").read(tmp_path, "held_out")
    for bad in ("../validation", "a/b", ".hidden", ""):
        with pytest.raises(ConfigError, match="split name"):
            get_task("sst2").read(tmp_path, bad)
    with pytest.raises(DataError, match="Story Cloze folder holds train and dev"):
        get_task("story_cloze").read(tmp_path, "validation")


# ------------------------------------------------------------------ one strict rule for every format
from gpt1.tasks import hub  # noqa: E402
from gpt1.tasks.rows import MAX_FIELD_CHARS  # noqa: E402


def _jsonl_task(labels=None):
    spec = {"columns": {"text": "t", "label": "y"}}
    return get_task("jsonl", dict(spec, labels=labels) if labels else spec)


def _jsonl(tmp_path: Path, *rows: str) -> Path:
    return write(tmp_path / "train.jsonl", "".join(r + "\n" for r in rows))


@pytest.mark.parametrize("label", ['["pos"]', '{"c": "pos"}', "true", "1.5", '""', '"  "'])
def test_jsonl_label_that_is_not_a_string_or_integer_is_an_error(tmp_path: Path, label):
    path = _jsonl(tmp_path, '{"t": "fine", "y": "pos"}', '{"t": "odd", "y": ' + label + "}")
    with pytest.raises(DataError) as err:  # the label set read from the training file
        complete_generic_spec("jsonl", {"columns": {"text": "t", "label": "y"}}, tmp_path, "train")
    assert (Path(err.value.path), err.value.line, err.value.field) == (path, 2, "y")
    assert "['pos']" not in str(err.value)
    with pytest.raises(DataError) as err:  # labels given
        _jsonl_task(["pos", "neg"]).read(tmp_path, "train")
    assert (err.value.line, err.value.field) == (2, "y")


def test_jsonl_integer_label_is_the_class_of_its_digits(tmp_path: Path):
    _jsonl(tmp_path, '{"t": "a", "y": 1}', '{"t": "b", "y": "0"}', '{"t": "c", "y": "1"}')
    spec = complete_generic_spec(
        "jsonl", {"columns": {"text": "t", "label": "y"}}, tmp_path, "train"
    )
    assert spec["labels"] == ["0", "1"]
    assert [e.label for e in get_task("jsonl", spec).read(tmp_path, "train").examples] == [1, 0, 1]


@pytest.mark.parametrize(
    "row",
    ['{"t": "a", "y": "pos", "y": "neg"}', '{"t": "a", "y": "pos", "meta": {"k": 1, "k": 2}}'],
)
def test_jsonl_duplicate_keys_are_an_error(tmp_path: Path, row):
    _jsonl(tmp_path, '{"t": "fine", "y": "pos"}', row)
    with pytest.raises(DataError, match="appears twice") as err:
        _jsonl_task(["pos", "neg"]).read(tmp_path, "train")
    assert err.value.line == 2 and err.value.field in ("y", "k")


@pytest.mark.parametrize(
    "name,text",
    [
        ("test.csv", "id,review,review\n1,a,b\n"),
        ("test.tsv", "id\treview\treview\n1\ta\tb\n"),
    ],
)
def test_duplicate_header_names_are_an_error(tmp_path: Path, name, text):
    path = write(tmp_path / name, text)
    task = get_task(name.split(".")[1], {"columns": {"text": "review"}, "labels": ["x"]})
    with pytest.raises(DataError, match="appears twice in the header") as err:
        task.read(tmp_path, "test")
    assert (Path(err.value.path), err.value.line, err.value.field) == (path, 1, "review")


def test_duplicate_glue_header_names_are_an_error(tmp_path: Path):
    write(tmp_path / "train.tsv", "sentence\tlabel\tlabel\nnice\t1\t0\n")
    with pytest.raises(DataError, match="'label' appears twice"):
        get_task("sst2").read(tmp_path, "train")


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_one_field_size_limit_for_every_format(tmp_path: Path, fmt):
    def row(text: str) -> str:
        return {
            "csv": f"1,{text}\n",
            "tsv": f"1\t{text}\n",
            "jsonl": json.dumps({"id": "1", "review": text}) + "\n",
        }[fmt]

    head = {"csv": "id,review\n", "tsv": "id\treview\n", "jsonl": ""}[fmt]
    task = get_task(fmt, {"columns": {"text": "review", "id": "id"}, "labels": ["x"]})
    path = write(tmp_path / f"test.{fmt}", head + row("x" * MAX_FIELD_CHARS))
    assert len(task.read(tmp_path, "test").examples[0].text) == MAX_FIELD_CHARS
    path = write(tmp_path / f"test.{fmt}", head + row("ok") + row("x" * (10 * MAX_FIELD_CHARS)))
    with pytest.raises(DataError, match=f"the limit is {MAX_FIELD_CHARS:,}") as err:
        task.read(tmp_path, "test")
    assert (Path(err.value.path), err.value.field) == (path, "review")
    assert err.value.line == (3 if head else 2)
    skipped = task.read(tmp_path, "test", skip_bad_rows=True)
    assert len(skipped) == 1 and len(skipped.skipped) == 1


def test_field_size_limit_in_nested_jsonl_and_race_files(tmp_path: Path):
    big = "x" * (MAX_FIELD_CHARS + 1)
    write(tmp_path / "train.jsonl", json.dumps({"ctx": "c", "opts": ["a", big], "y": "1"}) + "\n")
    task = get_task(
        "jsonl",
        {"columns": {"context": "ctx", "choices": "opts", "label": "y"}, "labels": ["0", "1"]},
    )
    with pytest.raises(DataError, match="field 'opts\\[1\\]'"):
        task.read(tmp_path, "train")
    race = tmp_path / "RACE" / "dev" / "high"
    write(
        race / "1.txt",
        json.dumps({"article": big, "questions": ["q"], "options": [["a", "b"]], "answers": ["A"]}),
    )
    with pytest.raises(DataError, match="field 'article'"):
        get_task("race").read(tmp_path / "RACE", "dev")
    write(
        race / "1.txt",
        '{"article": "a", "article": "b", "questions": [], "options": [], "answers": []}',
    )
    with pytest.raises(DataError, match="'article' appears twice"):
        get_task("race").read(tmp_path / "RACE", "dev")


@pytest.mark.parametrize("score", ["nan", "NaN", "inf", "-Infinity", "1e999", "1_000", "0x10", ""])
def test_stsb_score_must_be_a_finite_decimal_number(tmp_path: Path, score):
    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    )
    write(tmp_path / "train.tsv", header + f"0\tg\tf\ty\t0\tn\tn\tA\tB\t{score}\n")
    err = read_error(tmp_path, "stsb", "train")
    assert (err.line, err.field) == (2, "score")


def test_jsonl_nan_and_infinity_are_not_json(tmp_path: Path):
    _jsonl(tmp_path, '{"t": "a", "y": NaN}')
    task = get_task("jsonl", {"columns": {"text": "t", "label": "y"}, "regression": True})
    with pytest.raises(DataError, match=r"train\.jsonl:1.*NaN is not JSON"):
        task.read(tmp_path, "train")
    _jsonl(tmp_path, '{"t": "a", "y": 2.5}', '{"t": "b", "y": "3"}', '{"t": "c", "y": true}')
    with pytest.raises(DataError, match="expected a number, got True") as err:
        task.read(tmp_path, "train")
    assert err.value.line == 3
    assert [e.label for e in task.read(tmp_path, "train", skip_bad_rows=True).examples] == [
        2.5,
        3.0,
    ]


@pytest.mark.parametrize(
    "value,message",
    [
        ("5", "expected text, got int"),
        ('["a"]', "expected text, got list"),
        ("null", "missing column"),
        ('"  "', "empty text"),
        ('"\\u0000"', "no printable character"),  # as the server refuses it
        ('"\\u200b\\t"', "no printable character"),
    ],
)
def test_jsonl_text_must_be_a_non_empty_string(tmp_path: Path, value, message):
    _jsonl(tmp_path, '{"t": ' + value + ', "y": "pos"}')
    with pytest.raises(DataError, match=message) as err:
        _jsonl_task(["pos"]).read(tmp_path, "train")
    assert (err.value.line, err.value.field) == (1, "t")


def test_jsonl_id_must_be_a_string_or_integer(tmp_path: Path):
    write(tmp_path / "test.jsonl", '{"t": "a", "i": 7}\n{"t": "b", "i": ["x"]}\n')
    task = get_task("jsonl", {"columns": {"text": "t", "id": "i"}, "labels": ["x"]})
    with pytest.raises(DataError) as err:
        task.read(tmp_path, "test")
    assert (err.value.line, err.value.field) == (2, "i")
    assert task.read(tmp_path, "test", skip_bad_rows=True).examples[0].uid == "7"


def test_empty_label_is_an_error(tmp_path: Path):
    write(tmp_path / "train.tsv", "sentence\tlabel\nnice\t1\nbad\t \n")
    with pytest.raises(DataError, match="empty label") as err:
        get_task("sst2").read(tmp_path, "train")
    assert (err.value.line, err.value.field) == (3, "label")


def test_utf16_file_is_named_as_such(tmp_path: Path):
    (tmp_path / "train.tsv").write_bytes("sentence\tlabel\nnice\t1\n".encode("utf-16"))
    with pytest.raises(DataError, match="UTF-16") as err:
        get_task("sst2").read(tmp_path, "train")
    assert err.value.line == 1


def _kind_labels(name: str) -> tuple:
    """What the hub reader is given of a registered task."""
    task = get_task(name)
    return task.kind, task.labels


def test_hub_rows_follow_the_same_rules(monkeypatch):
    rows = [
        {"sentence": "good", "label": 1, "idx": 0},
        {"sentence": "x" * (MAX_FIELD_CHARS + 1), "label": 0, "idx": 1},
        {"sentence": 5, "label": 0, "idx": 2},
        {"sentence": "fine", "label": True, "idx": 3},
        {"text_is_missing": "a", "label": 0, "idx": 4},
    ]
    monkeypatch.setattr(hub, "_load", lambda name, split: rows)
    task = get_task("sst2")
    with pytest.raises(DataError, match="limit is") as err:
        hub.read_hub(task.kind, task.labels, "glue/sst2", "train", hub.BadRows())
    assert (err.value.line, err.value.field) == (2, "sentence")
    bad = hub.BadRows(skip=True)
    examples, _, _ = hub.read_hub(task.kind, task.labels, "glue/sst2", "train", bad)
    assert [e.text for e in examples] == ["good"] and [e.line for e in bad.rows] == [2, 3, 4, 5]
    monkeypatch.setattr(
        hub,
        "_load",
        lambda name, split: [{"sentence1": "a", "sentence2": "b", "label": float("nan")}],
    )
    with pytest.raises(DataError, match="finite"):
        hub.read_hub(*_kind_labels("stsb"), "glue/stsb", "train", hub.BadRows())
    monkeypatch.setattr(
        hub,
        "_load",
        lambda name, split: [  # GLUE test rows: -1 is no label
            {"sentence1": "a", "sentence2": "b", "label": -1.0}
        ],
    )
    assert (
        hub.read_hub(*_kind_labels("stsb"), "glue/stsb", "test", hub.BadRows())[0][0].label is None
    )
    monkeypatch.setattr(
        hub,
        "_load",
        lambda name, split: [
            {"article": "a", "question": "q", "options": ["x", "y"], "answer": "Z"}
        ],
    )
    with pytest.raises(DataError, match="unknown answer 'Z'"):
        hub.read_hub(*_kind_labels("race"), "race/all", "train", hub.BadRows())


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink_loop(path: Path) -> None:
    path.symlink_to(path.name)


def _broken_symlink(path: Path) -> None:
    path.symlink_to("nowhere.tsv")


@pytest.mark.parametrize(
    "make,says",
    [
        (_directory, "is a directory"),
        (_fifo, "is not a regular file (a FIFO)"),
        (_symlink_loop, "is a symlink loop"),
        (_broken_symlink, "is a broken symlink (to nowhere.tsv)"),
    ],
    ids=["directory", "fifo", "symlink-loop", "broken-symlink"],
)
@pytest.mark.parametrize(
    "task,name",
    [("sst2", "train.tsv"), ("tsv", "train.tsv"), ("csv", "train.csv"), ("snli", "train.tsv")],
)
def test_a_split_name_that_is_not_a_file_says_what_it_is(tmp_path: Path, make, says, task, name):
    """`train.tsv` as a folder, a FIFO (never opened: reading it would block) or a symlink loop is
    named for what it is, not reported as missing."""
    from gpt1.errors import DataError

    make(tmp_path / name)
    generic = {"columns": {"text": "t", "label": "y"}, "labels": ["neg", "pos"]}
    reader = get_task(task, generic if task in ("tsv", "csv") else None)
    with pytest.raises(DataError, match=re.escape(says)) as caught:
        reader.read(tmp_path, "train")
    assert str(tmp_path / name) in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("make,says", [(_fifo, "a FIFO"), (_symlink_loop, "symlink loop")])
def test_a_data_argument_that_is_not_a_folder_says_what_it_is(tmp_path: Path, make, says):
    from gpt1.errors import DataError

    make(tmp_path / "data")
    with pytest.raises(DataError, match=says):
        get_task("sst2").read(tmp_path / "data", "train")


def test_glue_files_separated_by_commas_are_read_and_errors_say_what_was_read(tmp_path):
    """A `sentence,label` SST-2 file is read as comma-separated when named .csv, or when its
    name says nothing and its header holds commas and no tab; a failure names the separator
    used and the columns it gave."""
    sst = get_task("sst2")
    rows = 'sentence,label\n"a fine, long film",1\nbad,0\n'
    for name in ("held.csv", "held"):
        (tmp_path / name).write_text(rows)
        got = sst.read(tmp_path / name, "dev").examples
        assert [(e.text, e.label) for e in got] == [("a fine, long film", 1), ("bad", 0)], name
    (tmp_path / "held.tsv").write_text(rows)
    with pytest.raises(DataError) as err:
        sst.read(tmp_path / "held.tsv", "dev")
    message = str(err.value)
    assert "no column 'sentence'" in message and "tab-separated (by its extension)" in message
    assert "1 column: ['sentence,label']" in message
    (tmp_path / "other.csv").write_text("text,label\nbad,0\n")
    with pytest.raises(DataError, match=r"comma-separated .* 2 columns: \['text', 'label'\]"):
        sst.read(tmp_path / "other.csv", "dev")
