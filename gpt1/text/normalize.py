"""GPT-1's text normalisation before BPE: lowercasing, ftfy, text_standardize, spaCy word splitting.

This module owns everything between a raw string and the list of lower-cased spaCy tokens that
BPE sees. It reproduces the faithful reference (transformers 4.x slow `OpenAIGPTTokenizer` with
ftfy and spaCy, a port of OAI's text_utils.py) exactly, but faster:

- ftfy works line by line (`ftfy.fix_text` cuts its input at newlines); lines made only of
  characters on which no ftfy fixer acts (printable ASCII without '&', tab, newline) skip it.
- After `text_standardize` the text is single-space-separated chunks. spaCy tokenizes each
  whitespace-delimited piece on its own except for one cross-piece effect (see
  `SpacySplitter`), so the tokens of a chunk, or of a few linked chunks, can be cached.
- spaCy's time grows with the square of a piece's length when the piece has many prefixes or
  suffixes (100,000 '!' take minutes); long units go through `gpt1.text.spacy_linear.LinearSpacy`,
  the same algorithm in linear time with the same tokens.

Like transformers (and unlike OAI, which lowercases spaCy's tokens only), the raw text is
lower-cased before ftfy, and a literal "<unk>" is transformers' unknown token (id 0).
"""

from __future__ import annotations

import re
from typing import Literal

from gpt1.text.spacy_linear import LinearSpacy

Standardize = Literal["oai", "hf"]

# The reference (transformers) lowercases the raw text before ftfy, one character at a time
# through a regex; only the "<unk>" special token is exempt, and it is then split out and maps
# to id 0. Per-character lowering differs from str.lower() only for the capital sigma, whose
# lowercase depends on context in str.lower() (final sigma); CPython has no other such case.
UNK_TOKEN = "<unk>"
UNK_SENTINEL = " <unk> "  # stands for a literal <unk> in chunk lists; no chunk holds a space


def hf_lower(text: str) -> str:
    """Lowercase exactly like transformers' per-character pass (no final-sigma rule)."""
    return text.replace("\u03a3", "\u03c3").lower()


# ---------------------------------------------------------------------------------------------
# ftfy
_FTFY_CONFIG = None
_FTFY_NO_HTML = None
# Characters on which every ftfy fixer is the identity: ASCII needs no encoding repair, NFC
# leaves it unchanged, and the ASCII-affecting fixers need '&' (HTML entities), '\r' (line
# breaks), ESC (terminal escapes) or other C0 controls (removed). A hypothesis test checks it.
_FTFY_UNSAFE = re.compile(r"[^\t\n\x20-\x25\x27-\x7e]")


def _ftfy_configs():
    global _FTFY_CONFIG, _FTFY_NO_HTML
    if _FTFY_CONFIG is None:
        import ftfy

        _FTFY_CONFIG = ftfy.TextFixerConfig(explain=False)
        _FTFY_NO_HTML = _FTFY_CONFIG._replace(unescape_html=False)
    return _FTFY_CONFIG, _FTFY_NO_HTML


def fix_text(text: str) -> str:
    """`ftfy.fix_text(text)` with default settings, skipping lines that ftfy cannot change."""
    if not _FTFY_UNSAFE.search(text):
        return text
    from ftfy import fix_and_explain

    config, no_html = _ftfy_configs()
    max_len = config.max_decode_length
    out: list[str] = []
    pos, n = 0, len(text)
    # Same segmentation as ftfy.fix_text: one segment per line (newline kept), at most
    # max_decode_length characters; once a segment holds '<', HTML unescaping stays off for
    # the rest of the text.
    while pos < n:
        end = text.find("\n", pos) + 1 or n
        if end - pos > max_len:
            end = pos + max_len
        segment = text[pos:end]
        if config is not no_html and "<" in segment:
            config = no_html
        if _FTFY_UNSAFE.search(segment):
            segment = fix_and_explain(segment, config).text
        out.append(segment)
        pos = end
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# text_standardize
_REPLACE = str.maketrans(
    {"\u2014": "-", "\u2013": "-", "\u2015": "-", "\u2026": "...", "\u00b4": "'"}
)
# A maximal run of one repeated character from the set, padded with spaces: the same as OAI's
# alternation (-+|~+|!+|...) since each alternative is a run of a single character.
_PAD_OAI = re.compile(r"""(([-~!";?+,)(/*\[\]}{|_])\2*)""")
# OAI wrote its pattern as a non-raw string, so '\\+' became "literal +" and backslashes are not
# padded; PORT/HF use a raw string and pad backslash runs too (reference d.1.9).
_PAD_HF = re.compile(r"""(([-~!";?+,)(\\/*\[\]}{|_])\2*)""")
# OAI's re.sub(r"\s*\n\s*", " \n ", text) replaces each whitespace run that holds a newline
# (the leftmost match starts where the run starts and \s* runs to its end), but it retries at
# every position of a run without one: quadratic in the run. Whole runs, tested for "\n", are
# the same replacement in linear time (a hypothesis test checks the equality).
_WS_RUN = re.compile(r"\s+")


def _newline_runs(text: str, replacement: str) -> str:
    r"""`re.sub(r"\s*\n\s*", replacement, text)` in time linear in the text."""
    if "\n" not in text:
        return text
    return _WS_RUN.sub(lambda m: replacement if "\n" in m.group() else m.group(), text)


_OTHER_WS = re.compile(r"[^\S\n]+")
_CHUNK = re.compile(r"\S+|\n")


def _pad(text: str, standardize: Standardize) -> str:
    if standardize == "oai":
        return _PAD_OAI.sub(r" \1 ", text)
    if standardize == "hf":
        return _PAD_HF.sub(r" \1 ", text)
    raise ValueError(f"standardize must be 'oai' or 'hf', not {standardize!r}")


def text_standardize(text: str, standardize: Standardize = "oai") -> str:
    """OAI's text_standardize (or the HF/PORT variant that also pads backslashes)."""
    text = _pad(text.translate(_REPLACE), standardize)
    text = _newline_runs(text, " \n ")
    return _OTHER_WS.sub(" ", text).strip()


def standardized_chunks(text: str, standardize: Standardize = "oai") -> list[str]:
    """`text_standardize(text).split(" ")` (empty list for empty output), computed directly:
    each whitespace run holding a newline becomes one "\\n" chunk, other runs separate chunks."""
    text = _newline_runs(_pad(text.translate(_REPLACE), standardize), "\n")
    chunks = _CHUNK.findall(text)
    # strip(): no leading or trailing newline chunk
    start, end = 0, len(chunks)
    while start < end and chunks[start] == "\n":
        start += 1
    while end > start and chunks[end - 1] == "\n":
        end -= 1
    return chunks[start:end] if (start, end) != (0, len(chunks)) else chunks


def chunks(text: str, standardize: Standardize = "oai", lower_first: bool = True) -> list[str]:
    """Raw text -> standardized chunks, the whole pipeline before spaCy.

    lower_first=True (transformers): the raw text is lower-cased first, and a literal "<unk>"
    is cut out and appears as `UNK_SENTINEL` (the pieces around it are normalised
    separately). lower_first=False (OAI text_utils.py): the text keeps its case until spaCy has
    tokenized it, so spaCy's cased exceptions apply ("Mr." stays one token).
    """
    if not lower_first:
        return standardized_chunks(fix_text(text), standardize)
    text = hf_lower(text)
    if UNK_TOKEN not in text:
        return standardized_chunks(fix_text(text), standardize)
    out: list[str] = []
    for i, piece in enumerate(text.split(UNK_TOKEN)):
        if i:
            out.append(UNK_SENTINEL)
        out.extend(standardized_chunks(fix_text(piece), standardize))
    return out


# ---------------------------------------------------------------------------------------------
# spaCy
class SpacySplitter:
    """spaCy's English tokenizer (blank pipeline, tokenizer only), applied to chunks.

    spaCy splits text at spaces and tokenizes each piece with its prefix/suffix/infix rules
    and special cases, on its own. One step looks across pieces: special cases that contain
    punctuation (":)", "''", "'s") are also found by a phrase matcher over the token
    sequence, which ignores whitespace, and overlapping matches are resolved longest first.
    A match across a space is never applied, but it can block one inside the next piece
    ("' ''tis" gives ', ', ', tis while "''tis" alone gives '', tis). `link` therefore joins
    chunks whose boundary such a match could span; they are tokenized together.
    """

    def __init__(self) -> None:
        from spacy.lang.en import English
        from spacy.tokenizer import Tokenizer as SpacyTokenizer

        nlp = English()
        tok = self._tokenizer = nlp.tokenizer
        self._special = set(tok.rules)
        # The phrase patterns spaCy builds (Tokenizer.add_special_case): each special case
        # with an affix, as tokenized by the affix rules alone.
        bare = SpacyTokenizer(
            nlp.vocab,
            rules={},
            prefix_search=tok.prefix_search,
            suffix_search=tok.suffix_search,
            infix_finditer=tok.infix_finditer,
            token_match=tok.token_match,
            url_match=tok.url_match,
        )
        # keyed by the two characters around the boundary, for a quick first test
        self._pairs: dict[str, list[tuple[str, str]]] = {}
        patterns: dict[str, list[str]] = {}
        for key in tok.rules:
            if tok.faster_heuristics and not (
                tok.find_prefix(key) or tok.find_infix(key) or tok.find_suffix(key) or " " in key
            ):
                continue
            pattern = patterns[key] = [t.text for t in bare(key)]
            for x, y in zip(pattern, pattern[1:]):  # tokens a boundary could fall between
                if x and y and not x.isspace() and not y.isspace():
                    self._pairs.setdefault(x[-1] + y[0], []).append((x, y))
        # spaCy's cost grows with the square of a piece's length when the piece has many
        # affixes (100,000 '!' take minutes); long units go through the linear equivalent.
        linear = LinearSpacy(tok, patterns)
        self._linear = linear if linear.supported else None

    def link(self, chunk_list: list[str]) -> list[str]:
        """Chunks, with runs that must be tokenized together joined by spaces into one unit:
        a boundary is linked when the left chunk ends with one token of a special-case
        pattern and the right chunk starts with the next one."""
        units: list[str] = []
        pairs = self._pairs
        prev = ""
        for chunk in chunk_list:
            candidates = pairs.get(prev[-1:] + chunk[:1])
            if (
                candidates
                and chunk != UNK_SENTINEL
                and any(prev.endswith(x) and chunk.startswith(y) for x, y in candidates)
            ):
                units[-1] = units[-1] + " " + chunk
            else:
                units.append(chunk)
            prev = chunk if chunk != UNK_SENTINEL else ""
        return units

    def split(self, units: list[str]) -> list[list[str]]:
        """The lower-cased spaCy tokens of each unit (a chunk or linked chunks). Chunks hold
        no whitespace, so the newline chunk "\\n" is the caller's to handle (its BPE is
        fixed: "\\n</w>").

        A chunk of ASCII letters that is not one of spaCy's special cases ("cannot", "Gonna")
        is one token: no English prefix, suffix or infix rule matches letters alone. Units over
        _LONG_UNIT characters go through `LinearSpacy` (spaCy's own cost is quadratic in
        them); other chunks go through spaCy in one call, other linked units one by one.
        """
        out: list[list[str] | None] = [None] * len(units)
        hard: list[int] = []
        for i, unit in enumerate(units):
            if _LETTERS.fullmatch(unit) and unit not in self._special:
                out[i] = [unit.lower()]
            elif len(unit) > _LONG_UNIT and self._linear is not None:
                out[i] = [t.lower() for t in self._linear(unit)]
            elif " " in unit:
                out[i] = [t.text.lower() for t in self._tokenizer(unit)]
            else:
                hard.append(i)
        if hard:
            # Joined by newlines, not spaces: spaCy makes each "\\n " a whitespace token, which
            # no special-case pattern contains, so chunks that were never neighbours in the
            # text cannot affect each other through the phrase matcher.
            tokens: list[str] = []
            pos = iter(hard)
            for token in self._tokenizer(" \n ".join(units[i] for i in hard)):
                if token.is_space:
                    out[next(pos)], tokens = tokens, []
                else:
                    tokens.append(token.text.lower())
            out[next(pos)] = tokens
        return out  # type: ignore[return-value]


_LETTERS = re.compile(r"[A-Za-z]+")
# Units longer than this go through LinearSpacy; shorter ones are faster in spaCy itself.
_LONG_UNIT = 64


class Normalizer:
    """Raw text -> the lower-cased spaCy tokens BPE sees (for training and inspection)."""

    def __init__(self, standardize: Standardize = "oai", lower_first: bool = True) -> None:
        self.standardize: Standardize = standardize
        self.lower_first = lower_first
        self._splitter = SpacySplitter()
        self._cache: dict[str, list[str]] = {"\n": ["\n"], UNK_SENTINEL: [UNK_TOKEN]}

    def words(self, text: str) -> list[str]:
        units = self._splitter.link(chunks(text, self.standardize, self.lower_first))
        cache = self._cache
        if len(cache) > 1_000_000:
            self._cache = cache = {"\n": ["\n"], UNK_SENTINEL: [UNK_TOKEN]}
        missing = [u for u in dict.fromkeys(units) if u not in cache]
        cache.update(zip(missing, self._splitter.split(missing)))
        return [w for u in units for w in cache[u]]
