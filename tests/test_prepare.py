"""`gpt1 prepare`: corpus files -> token shards + meta.json + tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpt1.errors import DataError
from gpt1.text.prepare import PrepareOptions, choose_val, prepare, strip_gutenberg
from gpt1.text.shards import read_header, read_shard
from gpt1.text.tokenizer import Tokenizer

HEADER = (
    "The Project Gutenberg EBook of Something\nLicence blah blah header words\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK SOMETHING ***\n"
)
FOOTER = "\n*** END OF THIS PROJECT GUTENBERG EBOOK SOMETHING ***\nFull licence text here.\n"
PARAGRAPHS = [
    "It was a dark and stormy night; the rain fell in torrents.",
    "Except at occasional intervals, when it was checked by a violent gust.",
    "Call me Ishmael. Some years ago -- never mind how long precisely.",
    "It is a truth universally acknowledged, that a single man...",
    "Happy families are all alike; every unhappy family is unhappy in its own way.",
]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    """A small vocabulary trained on the test text (no shared data needed)."""
    folder = tmp_path_factory.mktemp("vocab")
    Tokenizer.train(PARAGRAPHS * 2 + [HEADER, FOOTER], merges=120).save(folder)
    return folder


@pytest.fixture(scope="module")
def tok(vocab) -> Tokenizer:
    return Tokenizer.from_dir(vocab)


def _corpus(root: Path) -> Path:
    corpus = root / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "book.txt").write_text(
        HEADER + "\n\n".join(PARAGRAPHS[:3]) + FOOTER, encoding="utf-8"
    )
    (corpus / "sub" / "rows.jsonl").write_text(
        "".join(json.dumps({"text": p, "id": i}) + "\n" for i, p in enumerate(PARAGRAPHS[3:]))
        + "\n",
        encoding="utf-8",
    )
    (corpus / "sub" / "latin1.txt").write_bytes("Caf\xe9 au lait, cr\xe8me.".encode("latin-1"))
    (corpus / "empty.txt").write_text("  \n", encoding="utf-8")
    (corpus / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (corpus / "notes.md").write_text("ignored: not .txt/.jsonl", encoding="utf-8")
    return corpus


def _all_tokens(out: Path, split: str) -> np.ndarray:
    meta = json.loads((out / "meta.json").read_text())
    parts = [np.asarray(read_shard(out / s)) for s in meta["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def test_prepare_writes_shards_meta_and_tokenizer(tmp_path, vocab, tok):
    corpus = _corpus(tmp_path)
    out = tmp_path / "out"
    meta = prepare(
        [corpus], vocab, out, PrepareOptions(strip_gutenberg=True, val_fraction=0.3, quiet=True)
    )
    assert meta == json.loads((out / "meta.json").read_text())
    assert meta["format"] == "gpt1-tokens" and meta["version"] == 1
    assert meta["vocab_size"] == tok.vocab_size and meta["dtype"] == "uint16"
    assert (out / "vocab.json").read_bytes() == (vocab / "vocab.json").read_bytes()
    assert (out / "merges.txt").read_bytes() == (vocab / "merges.txt").read_bytes()
    stats = meta["stats"]
    # book.txt (1 document), latin1.txt (1, its bad bytes replaced), rows.jsonl (2 rows)
    assert stats["documents"] == 4
    assert stats["skipped_empty"] == [str(corpus / "empty.txt")]
    assert stats["skipped_binary"] == [str(corpus / "image.txt")]
    assert stats["invalid_utf8_replaced"] == 2 and stats["gutenberg_stripped"] == 2 - 1
    assert [Path(s).name for s in meta["sources"]] == [
        "book.txt",
        "empty.txt",
        "image.txt",
        "latin1.txt",
        "rows.jsonl",
    ]
    splits = meta["splits"]
    assert splits["val"]["documents"] == round(4 * 0.3) and splits["train"]["documents"] == 3
    docs = [
        tok.encode("\n\n".join(PARAGRAPHS[:3]) + "\n"),
        tok.encode("Caf\ufffd au lait, cr\ufffdme."),
        tok.encode(PARAGRAPHS[3]),
        tok.encode(PARAGRAPHS[4]),
    ]
    train, val = _all_tokens(out, "train"), _all_tokens(out, "val")
    assert len(train) + len(val) == sum(map(len, docs)) == stats["tokens"]
    assert splits["train"]["tokens"] == len(train)
    # the split is by document: each split is a concatenation of whole documents, in order
    for split, ids in (("train", train), ("val", val)):
        pieces = [d for d in docs if _contains(ids, d)]
        assert np.array_equal(ids, np.concatenate(pieces))
        assert read_header(out / splits[split]["shards"][0])["n_docs"] == len(pieces)
    # Gutenberg header and licence are gone
    text = tok.decode(np.concatenate([train, val]).tolist())
    assert "licence" not in text and "gutenberg" not in text and "stormy night" in text


def _contains(haystack: np.ndarray, needle: list[int]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n].tolist() == needle for i in range(len(haystack) - n + 1))


def test_prepare_is_deterministic_and_workers_give_the_same_shards(tmp_path, vocab, monkeypatch):
    import gpt1.text.prepare

    monkeypatch.setattr(gpt1.text.prepare, "TASK_CHARS", 40)  # several tasks in flight, in order
    corpus = _corpus(tmp_path)
    opts = dict(
        doc_sep="blank-line", val_fraction=0.25, quiet=True, strip_gutenberg=True, shard_tokens=8
    )
    one = prepare([corpus], vocab, tmp_path / "one", PrepareOptions(**opts))
    two = prepare([corpus], vocab, tmp_path / "two", PrepareOptions(workers=2, **opts))
    assert one["splits"] == two["splits"]
    assert one["stats"]["documents"] == 3 + 1 + 2  # blank-line paragraphs of book.txt
    for split in ("train", "val"):
        assert np.array_equal(
            _all_tokens(tmp_path / "one", split), _all_tokens(tmp_path / "two", split)
        )


def test_validation_choice():
    assert choose_val(1, 0.5, 0) == set()
    assert len(choose_val(2, 0.001, 0)) == 1  # at least one when there are two
    assert len(choose_val(1000, 0.01, 0)) == 10
    assert len(choose_val(3, 0.99, 0)) == 2  # never every document
    assert choose_val(1000, 0.01, 7) == choose_val(1000, 0.01, 7) != choose_val(1000, 0.01, 8)
    assert choose_val(50, 0.0, 0) == set()


def test_existing_output_is_refused_unless_overwrite(tmp_path, vocab):
    corpus = _corpus(tmp_path)
    out = tmp_path / "out"
    prepare([corpus], vocab, out, PrepareOptions(quiet=True))
    with pytest.raises(DataError, match="--overwrite"):
        prepare([corpus], vocab, out, PrepareOptions(quiet=True))
    meta = prepare([corpus / "book.txt"], vocab, out, PrepareOptions(quiet=True, overwrite=True))
    assert meta["stats"]["documents"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out"]  # no temp folders


def test_bad_jsonl_names_file_line_and_field(tmp_path, vocab):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n\n{"body": "no text field"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:3, field 'text'"):
        prepare([bad], vocab, tmp_path / "o1", PrepareOptions(quiet=True))
    bad.write_text('{"text": "fine"}\n{"text": "broken\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:2: invalid JSON"):
        prepare([bad], vocab, tmp_path / "o2", PrepareOptions(quiet=True))
    bad.write_text('{"text": "' + "word " * 5000 + '"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad.jsonl:1: line of .* MiB exceeds"):
        prepare([bad], vocab, tmp_path / "o3", PrepareOptions(quiet=True, max_line_bytes=1000))
    assert not any(p.name.startswith(".o") for p in tmp_path.iterdir())


def test_invalid_utf8_in_jsonl_is_replaced_and_counted(tmp_path, vocab, tok):
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'{"text": "caf\xe9 ok"}\n{"text": "fine"}\n')
    meta = prepare([rows], vocab, tmp_path / "out", PrepareOptions(quiet=True, val_fraction=0))
    assert meta["stats"]["invalid_utf8_replaced"] == 1
    assert _all_tokens(tmp_path / "out", "train").tolist() == tok.encode(
        "caf\ufffd ok"
    ) + tok.encode("fine")


def test_missing_and_empty_inputs(tmp_path, vocab):
    with pytest.raises(DataError, match="no such file or folder"):
        prepare([tmp_path / "nope"], vocab, tmp_path / "o", PrepareOptions(quiet=True))
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(DataError, match="no documents"):
        prepare([tmp_path / "e.txt"], vocab, tmp_path / "o", PrepareOptions(quiet=True))


def test_strip_gutenberg():
    assert strip_gutenberg(HEADER + "body" + FOOTER).strip() == "body"
    assert strip_gutenberg("no markers") is None


def test_cli_prepare(tmp_path, vocab, capsys):
    from gpt1.cli import main

    inputs = ["prepare", "--corpus", str(_corpus(tmp_path)), "--vocab", str(vocab)]
    options = ["--doc-sep", "blank-line", "--quiet", "--strip-gutenberg", "--shard-tokens", "10"]
    code = main([*inputs, "--out", str(tmp_path / "out"), *options])
    out = capsys.readouterr().out
    assert code == 0 and "6 documents" in out and "skipped files: 2" in out
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    # tiny --shard-tokens: a shard per document (documents are never cut)
    assert len(meta["splits"]["train"]["shards"]) == meta["splits"]["train"]["documents"]
    code = main([*inputs, "--out", str(tmp_path / "out2"), "--val-fraction", "1.5"])
    assert code == 2 and "--val-fraction" in capsys.readouterr().err


@pytest.mark.data
def test_prepare_a_gutenberg_novel(shared_data, tmp_path):
    novel = shared_data / "corpus" / "gutenberg" / "1661.txt"
    vocab = shared_data / "gpt1_tokenizer"
    meta = prepare(
        [novel],
        vocab,
        tmp_path / "out",
        PrepareOptions(strip_gutenberg=True, doc_sep="blank-line", quiet=True),
    )
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 40478
    assert meta["splits"]["val"]["documents"] >= 1
    assert Tokenizer.from_dir(tmp_path / "out").vocab_size == 40478
    tok = Tokenizer.from_dir(vocab)
    train, val = _all_tokens(tmp_path / "out", "train"), _all_tokens(tmp_path / "out", "val")
    assert "sherlock holmes" in tok.decode(train[:60].tolist())
    text = tok.decode(np.concatenate([train, val]).tolist())
    assert "start of this project gutenberg" not in text and "full license" not in text
    # ... which the unstripped file does hold
    raw = novel.read_text(encoding="utf-8")
    assert "full license" in tok.decode(tok.encode(raw[-25000:]))


@pytest.mark.parametrize("doc_sep", ["blank-line", "line", "==="])
def test_txt_split_while_reading_equals_splitting_the_whole_file(tmp_path, monkeypatch, doc_sep):
    import random

    import gpt1.text.prepare as prep

    rng = random.Random(doc_sep)
    pieces = ["word", " ", "\n", "\n\n", "\r\n\r\n", "\n \t\n  ", "=", "===", "====", "é", "\n\n\n"]
    raw = "\ufeff".encode() + "".join(rng.choice(pieces) for _ in range(3000)).encode()
    raw += b"\xff tail \xc3"  # invalid UTF-8 in the middle of a read and at the very end
    (tmp_path / "a.txt").write_bytes(raw)
    whole_stats = prep.Stats()
    text = prep.read_text(tmp_path / "a.txt", whole_stats)
    expected = [p for p in prep._separator(doc_sep).split(text) if p.strip()]
    assert len(expected) > 20
    for chars in (1, 2, 7, 64, 1 << 20):
        monkeypatch.setattr(prep, "READ_CHARS", chars)
        stats = prep.Stats()
        got = list(prep.documents(tmp_path / "a.txt", prep.PrepareOptions(doc_sep=doc_sep), stats))
        assert got == expected, chars
        assert stats.invalid_utf8_replaced == whole_stats.invalid_utf8_replaced == 2
    (tmp_path / "blank.txt").write_text(
        " \n" * 10_000
    )  # larger than the head read to detect empties
    stats = prep.Stats()
    assert (
        list(prep.documents(tmp_path / "blank.txt", prep.PrepareOptions(doc_sep=doc_sep), stats))
        == []
    )
    assert stats.skipped_empty == [str(tmp_path / "blank.txt")]
