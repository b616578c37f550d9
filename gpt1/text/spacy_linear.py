"""spaCy's English tokenizer, in time linear in the length of a long whitespace-free piece.

spaCy strips prefixes and suffixes one at a time and rescans the whole remaining string each
time (the suffix regex is a search anchored at the end, so it tries every start position), so a
piece like 100,000 '!' costs O(n^2): minutes. `LinearSpacy` follows spaCy's algorithm
(`Tokenizer._tokenize_affixes`, `_split_affixes`, `_attach_tokens`, then the special-case
phrase matcher, `_apply_special_cases`) step for step, with the same regexes, special cases and
matcher patterns, but keeps the remaining string as two indices and runs the prefix and suffix
regexes on a short window at each end.

A window gives the same match as the whole string when every alternative of the regex either
looks at a bounded number of characters (fewer than half the window) or is a run of one
character class ("\\.\\.+"), whose match inside the window is decided before the window's edge
unless the run reaches it; in that case the window is doubled. `LinearSpacy.supported` checks
this on the regexes themselves; spaCy's English rules pass. The equality with spaCy is tested
on generated strings and on all the shared text (tests/test_tokenizer.py).
"""

from __future__ import annotations

import re
from typing import Any

try:  # Python 3.11+
    from re import _constants as sre_c  # type: ignore[attr-defined]
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

_UNBOUNDED = float("inf")


def _reach(items: Any) -> float:
    """How many characters a parsed regex can examine (lookarounds included); inf if unbounded."""
    total = 0.0
    for op, av in items:
        if op in (sre_c.LITERAL, sre_c.NOT_LITERAL, sre_c.IN, sre_c.ANY, sre_c.CATEGORY):
            total += 1
        elif op is sre_c.AT:
            pass
        elif op is sre_c.SUBPATTERN:
            total += _reach(av[-1])
        elif op is sre_c.BRANCH:
            total += max(_reach(b) for b in av[1])
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            _, high, sub = av
            inner = _reach(sub)
            total += _UNBOUNDED if high == sre_c.MAXREPEAT and inner else high * inner
        elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            total += _reach(av[1])
        else:  # back-references, possessive repeats, ...: not analysed
            return _UNBOUNDED
    return total


def _alternatives(pattern: str) -> list[list]:
    """The top-level alternatives of a regex, as parsed item lists (a common prefix or suffix
    that the parser factored out is put back into each)."""
    items = list(sre_parse.parse(pattern))
    branches = [i for i, (op, _) in enumerate(items) if op is sre_c.BRANCH]
    if len(branches) != 1:
        return [items]
    at = branches[0]
    return [items[:at] + list(alt) + items[at + 1 :] for alt in items[at][1][1]]


def _is_single_class_run(items: list, anchor: Any) -> bool:
    """X X+ (one literal or character class, then one or more of it), optionally anchored."""
    body = [(op, av) for op, av in items if not (op is sre_c.AT and av is anchor)]
    if len(body) != 2 or body[0][0] not in (sre_c.LITERAL, sre_c.IN):
        return False
    op, av = body[1]
    return (
        op is sre_c.MAX_REPEAT
        and av[0] == 1
        and av[1] == sre_c.MAXREPEAT
        and list(av[2]) == [body[0]]
    )


def _anchors(items: Any) -> set:
    """The anchor codes (^, $, ...) anywhere in a parsed regex."""
    found: set = set()
    for op, av in items:
        if op is sre_c.AT:
            found.add(av)
        elif op is sre_c.SUBPATTERN:
            found |= _anchors(av[-1])
        elif op is sre_c.BRANCH:
            for branch in av[1]:
                found |= _anchors(branch)
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            found |= _anchors(av[2])
        elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            found |= _anchors(av[1])
    return found


def _window_bound(pattern: str, anchor: Any) -> int | None:
    """The largest reach of the bounded alternatives of an affix regex, or None when some
    alternative is neither bounded nor a single-class run, or holds an anchor other than
    `anchor` (a window's edge would fake the start or end of the string)."""
    bound = 0
    for alt in _alternatives(pattern):
        if not _anchors(alt) <= {anchor}:
            return None
        reach = _reach(alt)
        if reach == _UNBOUNDED:
            if not _is_single_class_run(alt, anchor):
                return None
        else:
            bound = max(bound, int(reach))
    return bound


# spaCy's URL pattern allows "user:password@" as \S+(?::\S*)?@: on a piece with many ':' and no
# '@' the regex backtracks through every ':' and rescans to the end (quadratic). \S+@ accepts the
# same strings (\S covers ':'), and url_match is only tested for a match, anchored at both ends,
# so the answer is the same; it backtracks only at '@'.
_URL_USERINFO = r"(?:\S+(?::\S*)?@)?"


def _linear_url_match(url_match: Any) -> Any:
    pattern = getattr(url_match, "__self__", None)
    if not isinstance(pattern, re.Pattern) or _URL_USERINFO not in pattern.pattern:
        return url_match
    return re.compile(pattern.pattern.replace(_URL_USERINFO, r"(?:\S+@)?"), pattern.flags).match


class LinearSpacy:
    """Tokens of spaCy's tokenizer `tok` for one text, linear in the length of each piece."""

    def __init__(self, tok: Any, matcher_patterns: dict[str, list[str]]) -> None:
        from spacy.attrs import ORTH
        from spacy.matcher import PhraseMatcher

        self._prefix = tok.prefix_search
        self._suffix = tok.suffix_search
        self._infix = tok.infix_finditer
        self._url = _linear_url_match(tok.url_match)
        self._rules = {
            key: [t[ORTH] if ORTH in t else t["ORTH"] for t in value]
            for key, value in tok.rules.items()
        }
        self._max_special = max(map(len, self._rules), default=0)
        self._matcher = PhraseMatcher(tok.vocab)
        self._vocab = tok.vocab
        for key, pattern in matcher_patterns.items():
            self._matcher.add(key, [self._doc(pattern, [False] * len(pattern))])
        self._prefix_cache: dict[str, tuple[int, int]] = {}
        self._suffix_cache: dict[str, tuple[int, int]] = {}
        self.supported = False
        if tok.token_match is None and self._prefix is not None and self._suffix is not None:
            pre = _window_bound(self._prefix.__self__.pattern, sre_c.AT_BEGINNING)
            suf = _window_bound(self._suffix.__self__.pattern, sre_c.AT_END)
            if pre is not None and suf is not None:
                self._prefix_window = max(8, 2 * pre)
                self._suffix_window = max(8, 2 * suf)
                self.supported = True

    def _doc(self, words: list[str], spaces: list[bool]):
        from spacy.tokens import Doc

        return Doc(self._vocab, words=words, spaces=spaces)

    # -- regexes on windows ----------------------------------------------------------------
    def _prefix_len(self, s: str, lo: int, hi: int) -> int:
        return self._affix_len(s, lo, hi, at_end=False)

    def _suffix_len(self, s: str, lo: int, hi: int) -> int:
        return self._affix_len(s, lo, hi, at_end=True)

    def _affix_len(self, s: str, lo: int, hi: int, at_end: bool) -> int:
        """The length of the prefix (or, `at_end`, the suffix) spaCy finds in `s[lo:hi]`, read
        through a window at that end, doubled until the match is decided inside it (a match
        that reaches the window's inner edge might go on)."""
        if at_end:
            search, cache, size = self._suffix, self._suffix_cache, self._suffix_window
        else:
            search, cache, size = self._prefix, self._prefix_cache, self._prefix_window
        while True:
            if hi - lo <= size:
                start, end = self._match(search, cache, s[lo:hi])
                return end - start
            window = s[hi - size : hi] if at_end else s[lo : lo + size]
            start, end = self._match(search, cache, window)
            inside = (start != 0 or end == 0) if at_end else end < size  # no match: end == 0
            if inside:
                return end - start
            size *= 2

    @staticmethod
    def _match(search: Any, cache: dict[str, tuple[int, int]], window: str) -> tuple[int, int]:
        """(start, end) of search(window), (0, 0) for no match (affix matches are never
        empty); windows repeat in long runs, so results are kept (a bounded cache)."""
        found = cache.get(window)
        if found is None:
            m = search(window)
            found = (m.start(), m.end()) if m is not None else (0, 0)
            if len(cache) > 100_000:
                cache.clear()
            cache[window] = found
        return found

    def _special(self, s: str, lo: int, hi: int) -> bool:
        return 0 < hi - lo <= self._max_special and s[lo:hi] in self._rules

    # -- spaCy's steps -----------------------------------------------------------------------
    def _split_affixes(self, s: str) -> tuple[list[str], int, int, list[str]]:
        """`Tokenizer._split_affixes` on s: prefixes, the remaining s[lo:hi], suffixes."""
        prefixes: list[str] = []
        suffixes: list[str] = []
        lo, hi, last = 0, len(s), -1
        while hi > lo and hi - lo != last:
            if self._special(s, lo, hi):
                break
            last = hi - lo
            pre = self._prefix_len(s, lo, hi)
            if pre and self._special(s, lo + pre, hi):
                prefixes.append(s[lo : lo + pre])
                lo += pre
                break
            suf = self._suffix_len(s, lo + pre, hi)
            if suf and self._special(s, lo, hi - suf):
                suffixes.append(s[hi - suf : hi])
                hi -= suf
                break
            if pre and suf and pre + suf <= hi - lo:
                prefixes.append(s[lo : lo + pre])
                suffixes.append(s[hi - suf : hi])
                lo, hi = lo + pre, hi - suf
            elif pre:
                prefixes.append(s[lo : lo + pre])
                lo += pre
            elif suf:
                suffixes.append(s[hi - suf : hi])
                hi -= suf
        return prefixes, lo, hi, suffixes

    def _attach(self, middle: str) -> list[str]:
        """`Tokenizer._attach_tokens` for the remaining string (prefixes/suffixes aside)."""
        if not middle:
            return []
        rule = self._rules.get(middle)
        if rule is not None:
            return list(rule)
        if self._url is not None and self._url(middle):
            return [middle]
        out: list[str] = []
        start = 0
        for m in self._infix(middle) if self._infix is not None else ():
            infix_start, infix_end = m.start(), m.end()
            if infix_start == 0:
                continue
            if infix_start != start:
                out.append(middle[start:infix_start])
            if infix_start != infix_end:
                out.append(middle[infix_start:infix_end])
            start = infix_end
        if start < len(middle):
            out.append(middle[start:])
        return out

    def _piece(self, piece: str) -> list[str]:
        rule = self._rules.get(piece)
        if rule is not None:
            return list(rule)
        prefixes, lo, hi, suffixes = self._split_affixes(piece)
        return prefixes + self._attach(piece[lo:hi]) + suffixes[::-1]

    def __call__(self, text: str) -> list[str]:
        """spaCy's token texts for `text`, which holds no whitespace other than single spaces
        between pieces (what `SpacySplitter` passes)."""
        words: list[str] = []
        spaces: list[bool] = []
        for piece in text.split(" "):
            if not piece:
                raise ValueError("LinearSpacy takes pieces separated by single spaces")
            tokens = self._piece(piece)
            words.extend(tokens)
            spaces.extend([False] * (len(tokens) - 1) + [True])
        spaces[-1] = False
        return self._apply_special_cases(words, spaces)

    def _apply_special_cases(self, words: list[str], spaces: list[bool]) -> list[str]:
        """`Tokenizer._apply_special_cases`: phrase-matcher spans, longest first then leftmost,
        none sharing a first or last token with a kept one; each replaced by its rule when its
        text (with any inner space) is one."""
        matches = self._matcher(self._doc(words, spaces))
        if not matches:
            return words
        starts_by_length: dict[int, set[int]] = {}
        for _, start, end in matches:
            starts_by_length.setdefault(end - start, set()).add(start)
        seen = bytearray(len(words))
        kept: dict[int, int] = {}
        for length in sorted(starts_by_length, reverse=True):
            for start in sorted(starts_by_length[length]):
                end = start + length
                if not seen[start] and not seen[end - 1]:
                    kept[start] = end
                seen[start:end] = b"\x01" * length
        out: list[str] = []
        i = 0
        while i < len(words):
            end = kept.get(i)
            if end is None:
                out.append(words[i])
                i += 1
                continue
            text = "".join(
                w + (" " if sp and j < end - 1 else "")
                for j, (w, sp) in enumerate(zip(words[i:end], spaces[i:end]), i)
            )
            rule = self._rules.get(text)
            out.extend(rule if rule is not None else words[i:end])
            i = end
        return out
