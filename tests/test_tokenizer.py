"""The GPT-1 tokenizer: exact ids against the faithful reference, speed paths proven equal to
the slow ones, vocabulary checks, training, the `gpt1 tokenizer` command."""

from __future__ import annotations

import csv
import io
import json
import os
import pickle
import re
import string
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpt1.errors import DataError
from gpt1.text import normalize as textlib
from gpt1.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))
VOCAB = SHARED / "gpt1_tokenizer"
needs_vocab = pytest.mark.skipif(not VOCAB.is_dir(), reason=f"no GPT-1 vocabulary at {VOCAB}")

TRICKY = [
    "Hello, world! Don't stop -- now.",
    "em—dash en–dash bar― ellipsis… acute´s “curly” ‘quotes’",
    "a\\b \\\\ back\\slash",
    "Line one\r\nline two\n\n\n   line three  \t tabs",
    "Café naïve résumé Ünïcode ΣΑΣ ὈΔΥΣΣΕΎΣ 字 😀",
    "&amp; &lt;b&gt; &AMP; <b>bold</b> &amp;",
    "Peggotty?’ ‘’Tis so, ma’am. She’ll :-) :) (-: 8) '' ''tis",
    "U.S.A. e.g. i.e. 10a.m. 5p.m. $3.50 50% #tag @user http://example.com/x?y=1",
    "cannot gonna gotta wanna lemme y'all o'clock",
    "a <unk> b<UNK>c <unk><unk>",
    "mojibake: Ã©tÃ© â€™",
    "",
    "   ",
    "\n",
    "x",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    if not VOCAB.is_dir():
        pytest.skip(f"no GPT-1 vocabulary at {VOCAB}")
    return Tokenizer.from_dir(VOCAB)


@pytest.fixture(scope="module")
def tok_hf() -> Tokenizer:
    if not VOCAB.is_dir():
        pytest.skip(f"no GPT-1 vocabulary at {VOCAB}")
    return Tokenizer.from_dir(VOCAB, standardize="hf")


@pytest.fixture(scope="module")
def ref():
    """transformers 4.x slow OpenAIGPTTokenizer with ftfy + spaCy: the faithful reference."""
    transformers = pytest.importorskip("transformers")
    if not VOCAB.is_dir():
        pytest.skip(f"no GPT-1 vocabulary at {VOCAB}")
    transformers.logging.set_verbosity_error()
    r = transformers.OpenAIGPTTokenizer(
        str(VOCAB / "encoder_bpe_40000.json"), str(VOCAB / "vocab_40000.bpe")
    )
    assert r.fix_text is not None, "reference fell back to BasicTokenizer"
    return r


# ---------------------------------------------------------------------------------------------
# The vocabulary
@needs_vocab
def test_original_vocabulary_sizes_and_special_ids(tok):
    assert tok.vocab_size == len(tok.encoder) == 40478
    assert len(tok.merges) == 40000
    assert (tok.start_id, tok.delimiter_id, tok.classify_id) == (40478, 40479, 40480)
    assert tok.n_special == 3 and tok.total_size == 40481 == len(tok)
    assert tok.encoder["<unk>"] == 0 and tok.encoder["\n</w>"] == 40477
    assert (
        tok.decode([tok.start_id, 3570, tok.delimiter_id, 3570, tok.classify_id])
        == "_start_ hello _delimiter_ hello _classify_"
    )


@needs_vocab
def test_hf_file_names_load_the_same_vocabulary(tmp_path, tok):
    tok.save(tmp_path)
    again = Tokenizer.from_dir(tmp_path)
    assert again.encoder == tok.encoder and again.merges == tok.merges
    assert again.encode(TRICKY[0]) == tok.encode(TRICKY[0])


def _write_vocab(folder: Path, encoder: dict, merges: list[str]) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(encoder))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    return folder


def test_vocab_and_merges_that_do_not_belong_together(tmp_path):
    enc = {"<unk>": 0, "a": 1, "b": 2, "a</w>": 3, "b</w>": 4, "ab</w>": 5}
    good = _write_vocab(tmp_path / "good", enc, ["a b</w>"])
    assert Tokenizer.from_dir(good).merges == [("a", "b</w>")]
    bad = _write_vocab(tmp_path / "bad", enc, ["a b</w>", "b a</w>"])
    with pytest.raises(DataError, match=r"merges.txt:3.*'ba</w>' is not in the vocabulary"):
        Tokenizer.from_dir(bad)
    malformed = _write_vocab(tmp_path / "malformed", enc, ["a b</w> extra"])
    with pytest.raises(DataError, match=r"merges.txt:2.*two tokens"):
        Tokenizer.from_dir(malformed)
    gaps = _write_vocab(tmp_path / "gaps", {"<unk>": 0, "a": 5}, [])
    with pytest.raises(DataError, match=r"vocab.json.*0..1"):
        Tokenizer.from_dir(gaps)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "vocab.json").write_text("{not json")
    (tmp_path / "broken" / "merges.txt").write_text("")
    with pytest.raises(DataError, match="vocab.json.*cannot read"):
        Tokenizer.from_dir(tmp_path / "broken")
    with pytest.raises(DataError, match="no tokenizer files"):
        Tokenizer.from_dir(tmp_path)


def test_python_bpe_follows_merge_ranks():
    ranks = {("a", "b"): 1, ("b", "c</w>"): 0, ("a", "bc</w>"): 2}
    # (b, c</w>) ranks before (a, b), so "abc" becomes a + bc</w>, then abc</w>
    from gpt1.text.tokenizer import bpe

    assert bpe("abc", ranks) == ["abc</w>"]
    assert bpe("abab", {("a", "b"): 0}) == ["ab", "a", "b</w>"]
    assert bpe("x", ranks) == ["x</w>"]


@st.composite
def _learned_merges_and_words(draw):
    """Merges made like learned ones (each joins two tokens that exist by then), and words."""
    alphabet = list("abc")
    tokens = alphabet + [c + "</w>" for c in alphabet]
    merges: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, 40))):
        a = draw(st.sampled_from([t for t in tokens if not t.endswith("</w>")]))
        b = draw(st.sampled_from(tokens))
        if a + b not in tokens:  # learned merges make each token once
            merges.append((a, b))
            tokens.append(a + b)
    words = draw(st.lists(st.text(alphabet="abc", min_size=1, max_size=40), min_size=1, max_size=5))
    return merges, words


@given(_learned_merges_and_words())
@settings(max_examples=1500, deadline=None)
def test_heap_bpe_equals_python_bpe_for_ordered_merges(case):
    from gpt1.text.tokenizer import bpe, bpe_heap, merges_are_ordered

    merges, words = case
    assert merges_are_ordered(merges)
    ranks = {pair: i for i, pair in enumerate(merges)}
    for word in words:
        assert bpe_heap(word, ranks) == bpe(word, ranks)


def test_merges_out_of_order_keep_the_rescanning_bpe():
    from gpt1.text.tokenizer import bpe, bpe_heap, merges_are_ordered

    merges = [("ab", "a"), ("a", "b")]  # uses "ab" before the merge that makes it
    assert not merges_are_ordered(merges)
    ranks = {pair: i for i, pair in enumerate(merges)}
    assert bpe("ababx", ranks) != bpe_heap("ababx", ranks)  # why the check exists
    encoder = {t: i for i, t in enumerate(["a", "b", "x</w>", "ab", "aba"])}
    tok = Tokenizer(encoder, merges)  # no "<unk>": the Python BPE
    assert tok.encode("ababx") == [encoder.get(p, 0) for p in bpe("ababx", ranks)]


@needs_vocab
def test_heap_bpe_on_the_original_vocabulary(tok):
    import random

    from gpt1.text.tokenizer import bpe, bpe_heap, merges_are_ordered

    assert merges_are_ordered(tok.merges)
    rng = random.Random(0)
    words = ["".join(rng.choices("etaoinshrdlu'-.1", k=rng.randint(1, 60))) for _ in range(300)]
    for word in words + ["aaaaaaaaaaaa", "abababababa", "\n "]:
        assert bpe_heap(word, tok.ranks) == bpe(word, tok.ranks), word


# ---------------------------------------------------------------------------------------------
# Exactness against the reference
@needs_vocab
@pytest.mark.parametrize("text", TRICKY)
def test_tricky_strings_match_reference(tok, tok_hf, ref, text):
    want = ref.encode(text)
    assert tok_hf.encode(text) == want
    if "\\" not in text:
        assert tok.encode(text) == want


@needs_vocab
def test_backslash_is_padded_only_in_hf_mode(tok, tok_hf, ref):
    text = "path\\to file"
    assert tok_hf.encode(text) == ref.encode(text)
    assert tok.tokenize(text)[:4] == ["path", "\\", "to</w>", "file</w>"]
    assert tok_hf.tokenize(text)[:4] == ["path</w>", "\\</w>", "to</w>", "file</w>"]


@needs_vocab
def test_cross_chunk_special_case_matches_reference(tok, ref):
    # spaCy's special-case matcher spans the space in "' ''tis" (see SpacySplitter); the cached
    # chunk path must still give the in-context tokens, in either order of first sight
    fresh = Tokenizer.from_dir(VOCAB)
    assert fresh.encode("''tis") == ref.encode("''tis")
    assert fresh.encode("' ''tis") == ref.encode("' ''tis")
    assert fresh.encode("''tis") == ref.encode("''tis")
    assert ref.encode("' ''tis") != ref.encode("'") + ref.encode("''tis")
    # chunks that are new together but not neighbours must not interact either
    assert Tokenizer.from_dir(VOCAB).encode("' x ''tis") == ref.encode("' x ''tis")


def _oai_reference(ref, text: str) -> list[int]:
    """OAI's text_utils.py order, built from the reference's parts: ftfy -> text_standardize
    -> spaCy on the cased text -> lowercase each token -> BPE."""
    import ftfy

    doc = ref.nlp(textlib.text_standardize(ftfy.fix_text(text), "oai"))
    return [ref.encoder.get(p, 0) for t in doc for p in ref.bpe(t.text.lower()).split(" ")]


@needs_vocab
@pytest.mark.data
def test_lower_first_false_follows_oai_order(shared_data, ref):
    oai = Tokenizer.from_dir(VOCAB, lower_first=False)
    lines = TRICKY + _sample_lines(shared_data, every=400)
    assert [oai.encode(s) for s in lines] == [_oai_reference(ref, s) for s in lines]
    # spaCy's cased exceptions keep "Mr." whole, as in the original vocabulary ("mr.</w>")
    assert oai.tokenize("Mr. Holmes")[0] == "mr.</w>"
    assert Tokenizer.from_dir(VOCAB).tokenize("Mr. Holmes")[:2] == ["mr</w>", ".</w>"]


def _sample_lines(data: Path, every: int) -> list[str]:
    """A deterministic sample: every Nth line or field of the shared text."""
    lines: list[str] = []
    for path in sorted((data / "corpus" / "gutenberg").glob("*.txt")):
        lines += path.read_text(encoding="utf-8").split("\n")[:: every * 4]
    for path in sorted((data / "glue").rglob("*.tsv")):
        rows = path.read_text(encoding="utf-8").split("\n")[::every]
        lines += [f for r in rows for f in r.split("\t") if " " in f]
    for path in sorted((data / "snli").glob("s[12].*")):
        lines += path.read_text(encoding="utf-8").split("\n")[::every]
    for path in sorted((data / "scitail").rglob("*.jsonl")):
        rows = path.read_text(encoding="utf-8").splitlines()[:: every // 4]
        lines += [json.loads(r)["sentence1"] for r in rows]
    for path in sorted((data / "story_cloze").glob("*.csv")):
        with open(path, encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh))[:: every // 4]
        lines += [f for r in rows for f in r if " " in f]
    return [line for line in lines if line.strip()]


@needs_vocab
@pytest.mark.data
def test_deterministic_sample_of_shared_text_matches_reference(shared_data, ref):
    lines = _sample_lines(shared_data, every=40)
    assert len(lines) > 4000
    fresh = Tokenizer.from_dir(VOCAB, standardize="hf")  # cold caches, as a user would start
    bad = [line for line in lines if fresh.encode(line) != ref.encode(line)]
    assert bad == []
    # whole blocks at once (newlines inside, cross-line ftfy state, batches of new chunks)
    block = "\n".join(lines[:300])
    assert fresh.encode(block) == ref.encode(block)
    novel = (shared_data / "corpus" / "gutenberg" / "766-0.txt").read_text(encoding="utf-8")
    assert fresh.encode(novel[:150_000]) == ref.encode(novel[:150_000])


# ---------------------------------------------------------------------------------------------
# The fast paths equal the slow ones
SAFE_ASCII = st.text(
    alphabet=st.sampled_from([chr(c) for c in range(0x20, 0x7F) if chr(c) != "&"] + ["\t", "\n"]),
    max_size=60,
)


@given(SAFE_ASCII)
@settings(max_examples=300, deadline=None)
def test_ftfy_is_identity_on_the_skipped_characters(s):
    import ftfy

    assert ftfy.fix_text(s) == s


TEXTISH = st.text(
    alphabet=st.one_of(
        st.sampled_from(
            list("abcXYZ &<>;#\r\n\t'\"-…—“”‘’´ÃƒÂ©â€™¤") + ["\x1b", "\x00", "\x85", "\u2028", "é"]
        ),
        st.characters(),
    ),
    max_size=80,
)


@given(TEXTISH)
@settings(max_examples=300, deadline=None)
def test_fix_text_equals_ftfy(s):
    import ftfy

    assert textlib.fix_text(s) == ftfy.fix_text(s)


@given(TEXTISH)
@settings(max_examples=300, deadline=None)
def test_standardized_chunks_equal_split_of_text_standardize(s):
    from transformers.models.openai.tokenization_openai import text_standardize as hf_std

    assert textlib.text_standardize(s, "hf") == hf_std(s)
    expected = textlib.text_standardize(s, "oai")
    assert textlib.standardized_chunks(s, "oai") == (expected.split(" ") if expected else [])


@given(st.text(alphabet=" \t\n\r\x0b\x0c\x1c\x85\u2028\u00a0\u3000a-", max_size=60))
@settings(max_examples=2000, deadline=None)
def test_newline_runs_equal_the_reference_regex(s):
    import re as re_

    for replacement in ("\n", " \n "):
        assert textlib._newline_runs(s, replacement) == re_.sub(r"\s*\n\s*", replacement, s)


@given(st.from_regex(r"[a-z]{1,12}", fullmatch=True))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_letter_words_are_one_spacy_token_unless_special(word):
    splitter = _splitter()
    tokens = [t.text for t in splitter._tokenizer(word)]
    if word not in splitter._special:
        assert tokens == [word]


# ---------------------------------------------------------------------------------------------
# Long pieces: LinearSpacy (spaCy's algorithm with windowed affix regexes) equals spaCy
_PIECE_ALPHABET = list("!'.\"()-:;?$%#&*+,/<=>@[]^_`{|}~aZ1 ") + [
    "...",
    "''",
    "'s",
    "’s",
    ":)",
    "(-:",
    "n't",
    "…",
    "😀",
    "’",
    "‘",
    "“",
    "”",
    "—",
    "°C.",
    "°",
    "Mr.",
    "e.g.",
    "U.S.",
    "US$",
    "km²",
    "10a.m.",
    "http://x.com/y?z=1",
    "x@y.org",
    "tis",
    "cannot",
    "gonna",
    "\u00a3",
    "€",
    "¿",
    "¡",
    "«",
    "»",
    "✓",
    "™",
    "\\",
]
_piece_texts = st.lists(
    st.one_of(
        st.sampled_from(_PIECE_ALPHABET),
        st.builds(
            lambda c, n: c * n, st.sampled_from(list("!'.-)(?,;:\"$%*…’😀")), st.integers(1, 80)
        ),
        st.text(min_size=1, max_size=3),
    ),
    min_size=1,
    max_size=12,
).map("".join)


def _spacy_tokens(splitter: textlib.SpacySplitter, text: str) -> list[str]:
    return [t.text for t in splitter._tokenizer(text)]


def _pieces(text: str) -> str:
    """What SpacySplitter passes: no whitespace but single spaces between pieces."""
    return " ".join(text.split())


@given(_piece_texts)
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_linear_spacy_equals_spacy(text):
    splitter = _splitter()
    text = _pieces(text)
    assume(text)
    assert splitter._linear is not None, "spaCy's affix rules failed LinearSpacy's analysis"
    assert splitter._linear(text) == _spacy_tokens(splitter, text)


@pytest.mark.parametrize(
    "run",
    [
        "!",
        "'",
        ".",
        "-",
        ")",
        "(",
        "?!",
        "'.",
        "…",
        "’",
        "😀",
        ":)",
        "$",
        "%",
        "a!",
        "!a",
        "''tis ",
        "e.g.",
        "--",
        ".'",
        ",'",
        "a:",
        "a@",
        "x@y:",
        "a.b@",
        "http://a.b/",
    ],
)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65, 500])
def test_linear_spacy_equals_spacy_on_runs(run, n):
    splitter = _splitter()
    for text in (run * n, "word" + run * n, run * n + "word", "(" + run * n + ")'s"):
        text = _pieces(text)
        assert splitter._linear(text) == _spacy_tokens(splitter, text), text[:40]


@needs_vocab
@pytest.mark.parametrize(
    "text",
    [
        "!" * 3000,
        "'" * 2001,
        "." * 3000,
        "-" * 3000,
        ")" * 1500,
        "Wow" + "!?" * 700 + "x",
        "(" * 900 + "hi" + ")" * 900 + "'s",
        "’" * 999 + "tis",
        "😀" * 1000,
        "a" * 5000,
        "ab" * 2500,
        "'" * 5 + " " + "''tis" * 300,
        "z" * 2000 + "!" * 2000,
    ],
)
def test_long_punctuation_runs_match_reference(tok, ref, text):
    # the reference takes about a second on each; the fast path is linear in the length
    assert tok.encode(text) == ref.encode(text)


@given(st.text(alphabet="a1.:@/?#-_x", min_size=1, max_size=30))
@settings(max_examples=2000, deadline=None)
def test_linear_url_match_accepts_what_spacy_accepts(text):
    splitter = _splitter()
    assert bool(splitter._linear._url(text)) == bool(splitter._tokenizer.url_match(text))


def test_linear_spacy_refuses_regexes_it_cannot_window():
    from spacy.lang.en import English

    from gpt1.text.spacy_linear import LinearSpacy

    nlp = English()
    nlp.tokenizer.suffix_search = re.compile(r"(?:a[^x]*b)$").search  # unbounded, not one class
    assert not LinearSpacy(nlp.tokenizer, {}).supported
    nlp = English()
    assert LinearSpacy(nlp.tokenizer, {}).supported


_SPLITTER: list = []


def _splitter() -> textlib.SpacySplitter:
    if not _SPLITTER:
        _SPLITTER.append(textlib.SpacySplitter())
    return _SPLITTER[0]


def test_hf_lower_matches_per_character_lowering():
    s = "ΟΔΥΣΣΕΥΣ İstanbul ẞ Σ"
    assert textlib.hf_lower(s) == "".join(c.lower() for c in s)
    assert textlib.hf_lower(s) != s.lower()  # str.lower applies the final-sigma rule


# ---------------------------------------------------------------------------------------------
# Properties, batches, long input
# Any unicode (most of it outside the vocabulary, so only the id-range check applies), mixed with
# text the vocabulary covers, so the round trip is checked on many examples; derandomized so that
# CI draws the same examples every run (unseeded, the filtered share sometimes tripped
# Hypothesis's filter_too_much health check).
_COVERED = string.ascii_letters + string.digits + " .,;:!?'\"()-"


@needs_vocab
@given(st.one_of(st.text(max_size=200), st.text(alphabet=_COVERED, max_size=200)))
@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
def test_any_unicode_encodes_and_decodes_to_the_normalised_text(tok, s):
    ids = tok.encode(s)
    assert all(0 <= i < tok.vocab_size for i in ids)
    words = _normalizer().words(s)
    known = {t[0] for t in tok.encoder if len(t) == 1}
    assume("<unk>" not in words and all(c in known for w in words for c in w))
    assert tok.decode(ids) == " ".join(words)


_NORMALIZER: list = []


def _normalizer() -> textlib.Normalizer:
    if not _NORMALIZER:
        _NORMALIZER.append(textlib.Normalizer())
    return _NORMALIZER[0]


@needs_vocab
def test_decode_is_lowercased_standardised_text(tok):
    assert tok.decode(tok.encode("Hello—World… “Quote”")) == 'hello - world ... " quote "'
    with pytest.raises(DataError, match="outside this vocabulary"):
        tok.decode([tok.total_size])


@needs_vocab
def test_encode_batch_with_processes_equals_serial(tok):
    texts = TRICKY * 3
    assert tok.encode_batch(texts, processes=2) == [tok.encode(t) for t in texts]


@needs_vocab
def test_pickled_tokenizer_encodes_the_same(tok):
    again = pickle.loads(pickle.dumps(tok))
    assert again.encode(TRICKY[1]) == tok.encode(TRICKY[1])


@needs_vocab
def test_line_of_several_megabytes(tok):
    words = ["alpha", "beta,", "gamma", "(delta)", "epsilon's"]
    line = " ".join(words[i % 5] for i in range(600_000))  # ~4 MB, no newline
    assert len(line) > 3_500_000
    ids = tok.encode(line)
    per_cycle = sum(len(tok.encode(w)) for w in words)
    assert len(ids) == 120_000 * per_cycle
    assert ids[:per_cycle] == tok.encode(" ".join(words))


# ---------------------------------------------------------------------------------------------
# Training
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Don't panic -- it's only a test; the fox isn't real!\nNew line here.",
    "Naïve café owners sell “fresh” bread… every day.",
]


def test_train_saves_files_loadable_by_gpt1_and_transformers(tmp_path):
    trained = Tokenizer.train(CORPUS, merges=40)
    assert len(trained.merges) == 40
    assert trained.encoder["<unk>"] == 0
    assert trained.vocab_size == len(trained.encoder)
    trained.save(tmp_path)
    again = Tokenizer.from_dir(tmp_path)
    assert again.encoder == trained.encoder and again.merges == trained.merges
    text = "The lazy fox doesn't panic; the café is “fresh”."
    ids = trained.encode(text)
    assert again.encode(text) == ids
    assert trained.decode(ids) == " ".join(_normalizer().words(text))
    transformers = pytest.importorskip("transformers")
    hf = transformers.OpenAIGPTTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    assert hf.encode(text) == ids
    assert hf.encode("zzz qqq") == trained.encode("zzz qqq")  # unknown characters -> 0


def test_train_reads_files_and_learns_frequent_words_first(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("banana banana banana bandana\n" * 20, encoding="utf-8")
    trained = Tokenizer.train([path], merges=4)
    assert len(trained.merges) == 4
    assert trained.tokenize("banana") == ["banana</w>"]
    assert len(trained.tokenize("bandana")) > 1
    assert Tokenizer.train([path], merges=4, processes=2).merges == trained.merges
    assert Tokenizer.train([str(path)], merges=4).merges == trained.merges  # path as a str
    # three words ("banana", "bandana", "\n") allow six merges in all
    assert len(Tokenizer.train([path], merges=50).merges) == 6


# ---------------------------------------------------------------------------------------------
# The command
def _cli(monkeypatch, capsys, argv: list[str], stdin: bytes) -> tuple[int, str, str]:
    from gpt1.cli import main

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@needs_vocab
def test_cli_encode_decode(monkeypatch, capsys, tok):
    text = "Hello, world!\n\nDon't stop \xff now\n"
    code, out, _ = _cli(
        monkeypatch, capsys, ["tokenizer", "encode", "--vocab", str(VOCAB)], text.encode("latin-1")
    )
    assert code == 0
    lines = out.split("\n")
    assert lines[0] == " ".join(map(str, tok.encode("Hello, world!"))) and lines[1] == ""
    assert lines[2] == " ".join(map(str, tok.encode("Don't stop \ufffd now")))
    code, back, _ = _cli(
        monkeypatch, capsys, ["tokenizer", "decode", "--vocab", str(VOCAB)], out.encode()
    )
    assert code == 0 and back.split("\n")[:2] == ["hello , world !", ""]
    code, _, err = _cli(
        monkeypatch, capsys, ["tokenizer", "decode", "--vocab", str(VOCAB)], b"1 2\n3 x\n"
    )
    assert code == 2 and "<stdin>:2" in err and "integer ids" in err


def test_cli_train(monkeypatch, capsys, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS), encoding="utf-8")
    out = tmp_path / "vocab"
    code, _, _ = _cli(
        monkeypatch,
        capsys,
        ["tokenizer", "train", "--corpus", str(corpus), "--merges", "30", "--out", str(out)],
        b"",
    )
    assert code == 0 and len(Tokenizer.from_dir(out).merges) == 30
    code, _, err = _cli(
        monkeypatch,
        capsys,
        ["tokenizer", "train", "--corpus", str(corpus), "--merges", "30", "--out", str(out)],
        b"",
    )
    assert code == 2 and "--overwrite" in err
