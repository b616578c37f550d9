"""Readers for the zero-shot-only datasets, in their original release formats.

Owns: DPR (Rahman & Ng 2012, `train.c.txt` / `test.c.txt`: blocks of four lines -- sentence,
pronoun, "candidate A,candidate B", correct candidate -- separated by blank lines) and LAMBADA
(one passage per line; the last whitespace-separated word is the target). SST-2, CoLA, Story Cloze
and RACE come from `gpt1.tasks`, the fine-tuning readers.

Every reader raises `DataError(message, path, line, field)` on malformed input; nothing is skipped
silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpt1.errors import DataError


@dataclass(frozen=True)
class DprExample:
    sentence: str
    pronoun: str
    candidates: tuple[str, str]
    answer: int  # index into `candidates`


def _read_text(path: Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise DataError("no such file", path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path) from None


# ------------------------------------------------------------------------------------------ DPR
def read_dpr(path: str | Path) -> list[DprExample]:
    """DPR release file: four-line blocks separated by one or more blank lines."""
    path = Path(path)
    lines = _read_text(path).splitlines()
    examples: list[DprExample] = []
    block: list[tuple[int, str]] = []
    for number, raw in enumerate(lines + [""], start=1):
        if raw.strip():
            block.append((number, raw.strip()))
            continue
        if block:
            examples.append(_dpr_block(block, path))
            block = []
    if not examples:  # an empty file would score as 0 of 0 examples: refuse it instead
        raise DataError("no DPR example in this file (it is empty)", path)
    return examples


def _dpr_block(block: list[tuple[int, str]], path: Path) -> DprExample:
    first = block[0][0]
    if len(block) != 4:
        raise DataError(
            f"expected a block of 4 lines (sentence, pronoun, candidates, answer), "
            f"got {len(block)}",
            path,
            first,
        )
    (_, sentence), (pl, pronoun), (cl, cands), (al, answer) = block
    parts = [c.strip() for c in cands.split(",")]
    if len(parts) != 2 or not all(parts):
        raise DataError(
            f"expected two candidates separated by a comma, got {cands!r}", path, cl, "candidates"
        )
    if answer not in parts:
        # Some DPR lines differ only in case or surrounding articles; match case-insensitively.
        lowered = [p.lower() for p in parts]
        if answer.lower() not in lowered:
            raise DataError(
                f"answer {answer!r} is not one of the candidates {parts}", path, al, "answer"
            )
        index = lowered.index(answer.lower())
    else:
        index = parts.index(answer)
    if find_word(sentence, pronoun) < 0:
        raise DataError(
            f"pronoun {pronoun!r} does not occur as a word in the sentence", path, pl, "pronoun"
        )
    return DprExample(sentence, pronoun, (parts[0], parts[1]), index)


def find_word(text: str, word: str) -> int:
    """Character offset of the first whole-word, case-insensitive occurrence of `word`, or -1."""
    low, target = text.lower(), word.lower()
    start = 0
    while True:
        i = low.find(target, start)
        if i < 0:
            return -1
        before = low[i - 1] if i > 0 else " "
        after = low[i + len(target)] if i + len(target) < len(low) else " "
        if not before.isalnum() and not after.isalnum():
            return i
        start = i + 1


# -------------------------------------------------------------------------------------- LAMBADA
def read_lambada(path: str | Path) -> list[tuple[str, str]]:
    """(context, last word) per non-empty line; the context keeps its trailing space stripped."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise DataError("no LAMBADA .txt file in this folder", path)
        path = files[0]
    out: list[tuple[str, str]] = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        if len(words) < 2:
            raise DataError("a LAMBADA passage needs a context before its last word", path, number)
        out.append((" ".join(words[:-1]), words[-1]))
    if not out:  # an empty file would score as 0 of 0 passages: refuse it instead
        raise DataError("no LAMBADA passage in this file (it is empty)", path)
    return out
