"""GPT-1's text pipeline written with Hugging Face `tokenizers` (an export's `tokenizer.json`).

transformers' fast `OpenAIGPTTokenizerFast` splits on whitespace and punctuation (BERT style), so
its ids differ from the ids GPT-1 was trained on for ordinary text ("it's", "3.5", "doesn't").
This module rebuilds the gpt1 pipeline (`gpt1.text.normalize`, `gpt1.text.tokenizer`) out of the building
blocks the `tokenizers` library has, so that `AutoTokenizer.from_pretrained(EXPORT)` gives gpt1's
ids on nearly every line:

- normaliser: per-character lowercasing (no final-sigma rule), the ftfy fixes that are plain
  character maps (C1 controls read as Windows-1252, ligatures, full-width forms, curly quotes,
  line breaks, control characters, common HTML entities, NFC), then text_standardize's
  replacements (dashes, ellipsis, acute accent) and its whitespace rules;
- pre-tokeniser: whitespace split, newline kept as a word, text_standardize's punctuation runs
  isolated, then spaCy's English tokenizer emulated with spaCy's own prefix, suffix and infix
  regular expressions and its special cases (read from the installed spaCy when the file is
  written): prefixes peeled, then suffixes, then special cases split ("don't" -> "do", "n't"),
  then infixes;
- model: the same BPE (merges, `</w>` glued to the last character, unknown pieces -> `<unk>`).
- decoder: `</w>` read as a space, dropped on the last token, task tokens read as words: the text
  `gpt1.text.tokenizer.Tokenizer.decode` gives (newlines kept).

What regular expressions cannot express is left out, and makes the residual differences
(measured by benchmarks/hf_tokenizer_parity.py): ftfy's mojibake repair and its "no HTML
unescaping after '<'" rule, spaCy's affix loop order on tokens with several prefixes and
suffixes, and its special-case matcher across affixes.
"""

from __future__ import annotations

import html.entities
import re
from collections.abc import Sequence

from gpt1.text.normalize import Standardize

EOW = "</w>"
UNK = "<unk>"
# text_standardize's padded characters (gpt1.text.normalize._PAD_OAI / _PAD_HF); OAI does not pad "\".
_PADDED = {"oai": '-~!";?+,)(/*[]}{|_', "hf": '-~!";?+,)(\\/*[]}{|_'}
# HTML entities unescaped (after lowercasing): the common ones and accented Latin letters. ftfy
# unescapes all of HTML5's (and numeric ones); one normaliser step per entity costs time.
_ENTITY_NAMES = (
    "amp lt gt quot apos nbsp deg mdash ndash hellip rsquo lsquo ldquo rdquo copy reg "
    "pound euro cent yen sect para middot frac12 frac14 frac34 times divide laquo "
    "raquo szlig"
)
_ENTITY_LETTERS = re.compile(r"[a-z](acute|grave|circ|uml|tilde|cedil|ring|slash);")
_AFFIX_PASSES = 4  # suffixes peeled from one token; more are very rare


def _onig(pattern: str) -> str:
    """A Python `re` pattern in Oniguruma syntax (the `tokenizers` regex engine)."""
    return re.sub(
        r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8}))",
        lambda m: "\\x{%s}" % (m.group(1) or m.group(2)),
        pattern,
    )


def _alternation(items: Sequence[str]) -> str:
    # longest first, so that an alternative is never cut short by one of its own prefixes
    return "|".join(re.escape(s) for s in sorted(set(items), key=lambda s: (-len(s), s)))


def spacy_rules(standardize: Standardize = "oai") -> dict:
    """spaCy English's prefix, suffix and infix patterns and the special cases that can occur
    after lowercasing and text_standardize: {"prefixes", "suffixes", "infixes": [pattern],
    "specials": {text: [pieces]}}."""
    from spacy.lang.en import English

    nlp = English()
    padded = set(_PADDED[standardize])
    specials = {}
    for key, tokens in nlp.tokenizer.rules.items():
        pieces = [t[65] if 65 in t else t.get("ORTH") for t in tokens]  # 65 == spacy.attrs.ORTH
        if (
            key != key.lower()
            or padded & set(key)
            or any(c.isspace() for c in key)
            or any(c in key for c in "\u2018\u2019\u201c\u201d")
            or "".join(pieces) != key
        ):
            continue  # cannot reach spaCy as one chunk after lowercasing, ftfy and standardize
        specials[key] = pieces
    # spaCy's matcher also applies special cases across a split-off "." ("id." -> "i", "d" + "."
    # -> "i", "d."): the same as one more special case.
    for key, pieces in list(specials.items()):
        dotted = pieces[-1] + "."
        if len(pieces) > 1 and dotted in specials and key + "." not in specials:
            specials[key + "."] = pieces[:-1] + [dotted]
    # text_standardize pads a run of one character as one chunk; spaCy then splits the runs of
    # some characters ("!!!" -> "!", "!", "!") and keeps others whole ("---").
    singles = "".join(c for c in _PADDED[standardize] if len(nlp.tokenizer(c * 3)) == 3)
    return {
        "prefixes": list(nlp.Defaults.prefixes),
        "suffixes": list(nlp.Defaults.suffixes),
        "infixes": list(nlp.Defaults.infixes),
        "specials": specials,
        "singles": singles,
    }


def _normalizer():
    import ftfy.chardata as chardata
    from tokenizers import Regex
    from tokenizers import normalizers as n

    steps = [n.Replace("\u03a3", "\u03c3"), n.Lowercase()]  # gpt1.text.normalize.hf_lower
    # ftfy, in its own order: HTML entities, C1 controls, ligatures, width, quotes, line breaks,
    # control characters, NFC.
    entities = {f"&{k};": chardata.HTML_ENTITIES[f"&{k};"] for k in _ENTITY_NAMES.split()}
    entities.update(
        (f"&{k}", v) for k, v in html.entities.html5.items() if _ENTITY_LETTERS.fullmatch(k)
    )
    entities.update({"&#39;": "'", "&#34;": '"'})
    steps += [n.Replace(k, v) for k, v in entities.items()]
    for code in range(0x80, 0xA0):
        char = bytes([code]).decode("cp1252", errors="ignore")
        if char:
            steps.append(n.Replace(chr(code), char))
    maps = {**chardata.LIGATURES, **chardata.WIDTH_MAP}
    steps += [n.Replace(chr(k), v if isinstance(v, str) else chr(v)) for k, v in maps.items()]
    steps += [
        n.Replace(Regex("[\u02bc\u2018-\u201b]"), "'"),
        n.Replace(Regex("[\u201c-\u201f]"), '"'),
        n.Replace(Regex("\r\n|[\r\u2028\u2029\u0085]"), "\n"),
    ]
    controls = "".join(re.escape(chr(c)) for c in chardata.CONTROL_CHARS)
    steps += [n.Replace(Regex(f"[{controls}]"), ""), n.NFC()]
    # text_standardize: replacements, then whitespace (padding is the pre-tokeniser's job)
    steps += [
        n.Replace(Regex("[\u2014\u2013\u2015]"), "-"),
        n.Replace("\u2026", "..."),
        n.Replace("\u00b4", "'"),
        n.Replace(Regex(r"\s*\n\s*"), "\n"),
        n.Strip(),
    ]
    return n.Sequence(steps)


def _pre_tokenizer(rules: dict, standardize: Standardize):
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as p

    specials: dict[str, list[str]] = rules["specials"]
    exact = _alternation(specials)
    runs = "|".join(
        re.escape(c) + ("" if c in rules["singles"] else "+") for c in _PADDED[standardize]
    )
    # (spaCy's lists hold an empty entry, which would match everywhere)
    prefix, suffix, infix = (
        "|".join(_onig(x) for x in rules[k] if x) for k in ("prefixes", "suffixes", "infixes")
    )
    # A special case is never split by the affix rules (spaCy checks them first). Each pattern
    # starts with what it matches and checks the whole word in a look-behind, so that the
    # regex engine can skip ahead to candidate characters.
    not_special = "|".join("^" + re.escape(k) for k in sorted(specials, key=len, reverse=True))
    # Most positions hold a lowercase letter, where only the unit suffixes ("5km") can start:
    # a cheap first test skips them.
    skip_letters = r"(?=[^\p{Ll}]|(?<=[0-9])\p{Ll})"
    guard = rf"(?:{exact})(?:{suffix})*$"  # a special case, perhaps with suffixes
    # \G: each match starts where the previous one ended, so one pass peels every prefix
    peel_prefix = rf"\G(?=(?:{prefix}))(?!{guard})(?:{prefix})"
    peel_suffix = rf"{skip_letters}(?:{suffix})$(?<!{not_special})"
    by_piece: dict[str, list[str]] = {}
    for pieces in specials.values():
        for i in range(1, len(pieces)):
            whole, after = "".join(pieces[: i + 1]), "".join(pieces[i + 1 :])
            by_piece.setdefault(re.escape(pieces[i]) + f"(?={re.escape(after)}$)", []).append(
                "^" + re.escape(whole)
            )
    splits = [f"{piece}(?<={'|'.join(wholes)})" for piece, wholes in by_piece.items()]
    steps = [
        p.Split(Regex(r"[^\S\n]+"), "removed"),
        p.Split("\n", "isolated"),
        p.Split(Regex(runs), "isolated"),
        # spaCy's matcher keeps "''" whole when it starts or ends a word
        p.Split(Regex(rf"^'(?!{guard})'(?=[^'])|(?<=[^'])''$"), "isolated"),
    ]
    steps.append(p.Split(Regex(peel_prefix), "isolated"))
    steps += [p.Split(Regex(peel_suffix), "isolated")] * _AFFIX_PASSES
    if splits:
        steps.append(p.Split(Regex("|".join(splits)), "isolated"))
    steps.append(p.Split(Regex(infix), "isolated"))
    return p.Sequence(steps)


def unk_token(encoder: dict[str, int]) -> str | None:
    """The token unknown pieces become: gpt1 maps them to "<unk>", or to id 0 without one."""
    if UNK in encoder:
        return UNK
    return next((t for t, i in encoder.items() if i == 0), None)


def _decoder(special_tokens: Sequence[str]):
    """`</w>` read as a space (dropped on the last token), as `gpt1.text.tokenizer.Tokenizer.decode`
    does; a task token reads as a word of its own (its name, then a space), as in gpt1."""
    from tokenizers import Regex, decoders

    as_words = [decoders.Replace(Regex(f"^{re.escape(t)}$"), t + EOW) for t in special_tokens]
    return decoders.Sequence([*as_words, decoders.BPEDecoder(suffix=EOW)])


def build(
    encoder: dict[str, int],
    merges: Sequence[tuple[str, str]],
    special_tokens: Sequence[str] = (),
    standardize: Standardize = "oai",
):
    """A `tokenizers.Tokenizer` giving gpt1's ids for the vocabulary `encoder` + `merges`, with
    `special_tokens` added after the vocabulary (the task tokens of a fine-tuned model)."""
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import BPE

    tok = Tokenizer(
        BPE(
            vocab=dict(encoder),
            merges=list(merges),
            unk_token=unk_token(encoder),
            end_of_word_suffix=EOW,
            fuse_unk=False,
        )
    )
    tok.normalizer = _normalizer()
    tok.pre_tokenizer = _pre_tokenizer(spacy_rules(standardize), standardize)
    tok.decoder = _decoder(special_tokens)
    # gpt1 reads a literal "<unk>" (after lowercasing) as the unknown token
    if UNK in encoder:
        tok.add_special_tokens([AddedToken(UNK, normalized=True)])
    tok.add_special_tokens([AddedToken(t, normalized=False) for t in special_tokens])
    return tok
