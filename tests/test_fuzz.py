"""Hostile input never crashes or hangs: the tokenizer takes arbitrary unicode, and every dataset
reader, fed mutated copies of real files from ../shared/data (truncated lines, wrong column
counts, wrong encodings, huge fields, empty files, byte damage), either parses or raises the
project's own error type (`Gpt1Error`), within a time limit. The mutations and the reader table
live in helpers.faults; benchmarks/faults.py runs many more of them for the fault report."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SHARED_DATA as SHARED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpt1.errors import DataError, Gpt1Error
from gpt1.text.tokenizer import Tokenizer
from helpers import faults
from helpers.tiny import char_vocab, make_corpus

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Everything a Python str can hold: every plane, controls, combining marks, lone surrogates
# (what `surrogateescape` decoding produces), plus the characters the GPT-1 pipeline treats
# specially (newlines, dashes, ellipses, <unk>, `</w>`, HTML entities, mojibake).
SPECIAL = [
    "\n",
    "\r\n",
    "\t",
    "  ",
    "--",
    "—",
    "…",
    "<unk>",
    "</w>",
    "&amp;",
    "&#x1f600;",
    "Ã©",
    "\u00ad",
    "\u200b",
    "\ufeff",
    "\u03a3",
    "ß",
    "ﬁ",
    "İ",
    "\x00",
    "\x1b[31m",
    "\\",
]
UNICODE = st.text(st.characters(codec=None, categories=None), max_size=200)
TEXT = st.lists(st.one_of(UNICODE, st.sampled_from(SPECIAL)), max_size=8).map("".join)


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory) -> Tokenizer:
    tok = Tokenizer.from_dir(char_vocab(tmp_path_factory.mktemp("vocab")))
    tok.encode("warm up spaCy")
    return tok


@pytest.fixture(scope="module")
def gpt1_tokenizer() -> Tokenizer:
    folder = SHARED / "gpt1_tokenizer"
    if not folder.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    tok = Tokenizer.from_dir(folder)
    tok.encode("warm up spaCy")
    return tok


def check_encode(tok: Tokenizer, text: str) -> None:
    try:
        ids = tok.encode(text)
    except DataError:
        return  # a clear refusal (the project's error) is acceptable, a crash is not
    assert all(type(i) is int and 0 <= i < tok.vocab_size for i in ids)
    assert isinstance(tok.decode(ids), str)
    assert tok.encode(text) == ids  # the chunk cache gives the same answer twice


@FUZZ
@given(text=TEXT)
def test_tokenizer_takes_arbitrary_unicode(char_tokenizer, text):
    check_encode(char_tokenizer, text)


@settings(FUZZ, max_examples=60)
@given(text=TEXT)
def test_gpt1_tokenizer_takes_arbitrary_unicode(gpt1_tokenizer, text):
    check_encode(gpt1_tokenizer, text)


def test_tokenizer_huge_and_pathological_inputs(char_tokenizer):
    for text in [
        "a" * 200_000,
        "\n" * 50_000,
        "é" * 50_000 + "x",
        ("ab " * 50_000),
        "".join(chr(c) for c in range(0x20, 0x3000)),
        "\ud800" * 10,
    ]:
        check_encode(char_tokenizer, text)


def test_decode_of_foreign_ids_is_a_data_error(char_tokenizer):
    with pytest.raises(DataError, match="outside this vocabulary"):
        char_tokenizer.decode([0, 10**9])


# ------------------------------------------------------------------------------- readers
@pytest.fixture(scope="module")
def reader_table(tmp_path_factory):
    if not SHARED.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    work = tmp_path_factory.mktemp("readers")
    return {r.name: (r, faults.stage(r, work / "src")) for r in faults.readers(SHARED, work)}, work


READER_NAMES = [
    "cola",
    "sst2",
    "stsb",
    "qnli",
    "mnli (GLUE tsv)",
    "qqp",
    "snli (parallel lines)",
    "snli (textfooler)",
    "scitail (jsonl)",
    "story_cloze (csv)",
    "race (json folder, synthetic)",
    "race (jsonl, synthetic)",
    "generic tsv",
    "generic jsonl",
    "generic csv (choices)",
    "skip-bad-rows sst2",
    "lambada",
    "dpr (synthetic)",
    "token shard",
    "prepared meta.json",
    "tokenizer files",
]

MUTATION = st.tuples(
    st.sampled_from(faults.OPS),
    st.floats(0, 1, exclude_max=True),
    st.integers(0, 10_000),
    st.binary(min_size=1, max_size=16),
)


def test_reader_table_is_complete(reader_table):
    table, _ = reader_table
    assert sorted(table) == sorted(READER_NAMES)


@pytest.mark.parametrize("name", READER_NAMES)
def test_unmutated_real_file_parses(reader_table, name, tmp_path):
    table, _ = reader_table
    reader, clean = table[name]
    assert faults.try_input(reader, tmp_path / "case", clean) == "ok"


def parses_or_refuses_naming_the_file(reader, folder: Path, files: dict[str, bytes]) -> str:
    """Run the reader on `files`: "ok", or "error" when it refused with a one-line Gpt1Error
    naming one of its files (for parallel files, the first that ended may be the undamaged one).
    try_input fails the test on any other exception or a hang (10 s)."""
    outcome = faults.try_input(reader, folder, files, seconds=10)
    if outcome == "error":
        with pytest.raises(Gpt1Error) as refusal:
            reader.read(folder)
        message = str(refusal.value)
        assert "\n" not in message.strip(), f"{reader.name}: a multi-line error: {message!r}"
        assert any(Path(name).name in message for name in files), f"{reader.name}: {message!r}"
    return outcome


@pytest.mark.parametrize("name", READER_NAMES)
@settings(FUZZ, max_examples=25)
@given(mutation=MUTATION)
def test_mutated_file_parses_or_raises_project_error(reader_table, name, mutation):
    table, work = reader_table
    reader, clean = table[name]
    files = dict(clean)
    files[reader.target] = faults.mutate(clean[reader.target], *mutation)
    parses_or_refuses_naming_the_file(reader, work / "case", files)


# An empty merges file is a vocabulary with no merges (a character-level one): valid.
EMPTY_IS_VALID = {"tokenizer files"}


@pytest.mark.parametrize("op", faults.OPS)
def test_every_mutation_on_every_reader_once(reader_table, op, tmp_path):
    """Each kind of damage at least once per reader, whatever hypothesis chose above."""
    table, _ = reader_table
    for reader, clean in table.values():
        files = dict(clean)
        files[reader.target] = faults.mutate(clean[reader.target], op, 0.5, 7, b'\xff\x00,\t"')
        outcome = parses_or_refuses_naming_the_file(reader, tmp_path / "case", files)
        if op == "empty" and reader.name not in EMPTY_IS_VALID:
            # an empty data file holds nothing to read: it is refused, never read as 0 rows
            assert outcome == "error", f"{reader.name}: an empty {reader.target} was accepted"


def test_empty_file_is_a_clear_error_naming_the_file(reader_table, tmp_path):
    table, _ = reader_table
    reader, clean = table["sst2"]
    assert faults.try_input(reader, tmp_path / "case", {"dev.tsv": b""}) == "error"
    with pytest.raises(Gpt1Error, match="dev.tsv"):
        reader.read(tmp_path / "case")


# ------------------------------------------------------------------ structure-aware JSON fuzz
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(
    field=st.sampled_from(
        ["format", "version", "vocab_size", "splits", "train", "shards", "shard"]
    ),
    value=JSON,
)
def test_meta_json_with_any_value_in_any_field(tmp_path_factory, field, value):
    """Each field of a prepared folder's meta.json replaced by an arbitrary JSON value."""
    import json

    from gpt1.text.windows import open_prepared

    folder = make_corpus(tmp_path_factory.mktemp("meta"), n_train=600, n_val=100)
    meta = json.loads((folder / "meta.json").read_text())
    if field in ("format", "version", "vocab_size", "splits"):
        meta[field] = value
    elif field == "train":
        meta["splits"]["train"] = value
    elif field == "shards":
        meta["splits"]["train"]["shards"] = value
    else:
        meta["splits"]["train"]["shards"][0] = value
    (folder / "meta.json").write_text(json.dumps(meta))
    try:
        data = open_prepared(folder)
    except Gpt1Error:
        return
    assert data.vocab_size > 0 and "train" in data.splits


@FUZZ
@given(
    record=st.dictionaries(
        st.sampled_from(
            [
                "sentence1",
                "sentence2",
                "gold_label",
                "id",
                "pairID",
                "article",
                "question",
                "options",
                "answer",
                "example_id",
            ]
        ),
        JSON,
        max_size=8,
    )
)
def test_jsonl_readers_with_any_record(tmp_path_factory, record):
    """SciTail/SNLI JSON lines, RACE JSON lines and a generic jsonl task, each fed a line that is
    a JSON object with arbitrary values (numbers where text belongs, lists, nulls, ...)."""
    import json

    from gpt1.tasks.registry import get_task

    folder = tmp_path_factory.mktemp("jsonl")
    (folder / "dev.jsonl").write_text(json.dumps(record) + "\n")
    spec = {
        "columns": {"a": "sentence1", "b": "sentence2", "label": "gold_label"},
        "labels": ["entailment", "neutral"],
    }
    for task in (get_task("scitail"), get_task("race"), get_task("jsonl", spec)):
        for need in (True, False):
            try:
                split = task.read(folder, "dev", need_labels=need)
            except Gpt1Error:
                continue
            assert len(split.examples) == 1


@pytest.mark.parametrize("score", ["inf", "-inf", "nan", "Infinity", "1e400"])
def test_nonfinite_regression_scores_are_refused(tmp_path, score):
    from gpt1.tasks.registry import get_task

    (tmp_path / "dev.tsv").write_text(
        f"index\tsentence1\tsentence2\tscore\n0\ta cat\ta dog\t{score}\n"
    )
    with pytest.raises(DataError, match="finite") as err:
        get_task("stsb").read(tmp_path, "dev")
    assert err.value.line == 2 and err.value.field == "score"
