"""Readers for the data the zero-shot heuristics use, in each dataset's original release format.

Owns: DPR (Rahman & Ng 2012, `train.c.txt` / `test.c.txt`: blocks of four lines -- sentence,
pronoun, "candidate A,candidate B", correct candidate -- separated by blank lines), LAMBADA (one
passage per line; the last whitespace-separated word is the target), RACE (the release's JSON
files: article, questions, options, answers), and small fallbacks for SST-2 (GLUE TSV with a
header: sentence<TAB>label), CoLA (GLUE TSV without a header: source, label, mark, sentence) and
Story Cloze (the 2016 CSV: id, four sentences, two endings, right ending 1/2). The fallbacks exist
so `gpt1 zeroshot` works before/without `gpt1.tasks`; they keep to the same formats.

Every reader raises `DataError(message, path, line, field)` on malformed input; nothing is skipped
silently.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from gpt1.errors import DataError


@dataclass(frozen=True)
class DprExample:
    sentence: str
    pronoun: str
    candidates: tuple[str, str]
    answer: int          # index into `candidates`


@dataclass(frozen=True)
class RaceExample:
    article: str
    question: str
    options: tuple[str, ...]
    answer: int


@dataclass(frozen=True)
class StoryClozeExample:
    story: str
    endings: tuple[str, str]
    answer: int


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
    return examples


def _dpr_block(block: list[tuple[int, str]], path: Path) -> DprExample:
    first = block[0][0]
    if len(block) != 4:
        raise DataError(f"expected a block of 4 lines (sentence, pronoun, candidates, answer), "
                        f"got {len(block)}", path, first)
    (_, sentence), (pl, pronoun), (cl, cands), (al, answer) = block
    parts = [c.strip() for c in cands.split(",")]
    if len(parts) != 2 or not all(parts):
        raise DataError(f"expected two candidates separated by a comma, got {cands!r}", path, cl,
                        "candidates")
    if answer not in parts:
        # Some DPR lines differ only in case or surrounding articles; match case-insensitively.
        lowered = [p.lower() for p in parts]
        if answer.lower() not in lowered:
            raise DataError(f"answer {answer!r} is not one of the candidates {parts}", path, al,
                            "answer")
        index = lowered.index(answer.lower())
    else:
        index = parts.index(answer)
    if find_word(sentence, pronoun) < 0:
        raise DataError(f"pronoun {pronoun!r} does not occur as a word in the sentence", path, pl,
                        "pronoun")
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
    return out


# ----------------------------------------------------------------------------------------- RACE
def read_race(path: str | Path) -> list[RaceExample]:
    """RACE release: a folder (searched recursively) of JSON files, or one JSON / JSON-lines file.

    Each record has `article`, `questions`, `options` (one list per question) and `answers`
    (letters A, B, C, D).
    """
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".json", ".jsonl")
                   and p.is_file()) if path.is_dir() else [path]
    if not files:
        raise DataError("no RACE .txt/.json files in this folder", path)
    out: list[RaceExample] = []
    for file in files:
        text = _read_text(file)
        records = [(1, text)] if not file.suffix == ".jsonl" else [
            (n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
        for number, raw in records:
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(f"invalid JSON ({exc.msg})", file, number + exc.lineno - 1) from None
            out.extend(_race_record(record, file, number))
    return out


def _race_record(record: object, file: Path, line: int) -> list[RaceExample]:
    if not isinstance(record, dict):
        raise DataError("expected a JSON object", file, line)
    for key in ("article", "questions", "options", "answers"):
        if key not in record:
            raise DataError("missing key", file, line, key)
    qs, opts, answers = record["questions"], record["options"], record["answers"]
    if not (len(qs) == len(opts) == len(answers)):
        raise DataError("questions, options and answers differ in length", file, line)
    out = []
    for q, o, a in zip(qs, opts, answers):
        if not isinstance(a, str) or len(a) != 1 or not 0 <= ord(a) - ord("A") < len(o):
            raise DataError(f"answer {a!r} is not a letter naming one of {len(o)} options",
                            file, line, "answers")
        out.append(RaceExample(record["article"], q, tuple(o), ord(a) - ord("A")))
    return out


# ------------------------------------------------------------------- SST-2 / CoLA / Story Cloze
def _label(raw: str, path: Path, line: int, field: str) -> int:
    if raw.strip() not in ("0", "1"):
        raise DataError(f"expected label 0 or 1, got {raw!r}", path, line, field)
    return int(raw)


def read_sst2(path: str | Path) -> list[tuple[str, int]]:
    """GLUE SST-2 TSV with a `sentence<TAB>label` header."""
    path = Path(path)
    lines = _read_text(path).splitlines()
    if not lines or lines[0].split("\t")[:2] != ["sentence", "label"]:
        raise DataError("expected the header 'sentence<TAB>label'", path, 1)
    out = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 2:
            raise DataError("expected 2 tab-separated columns", path, number)
        out.append((cols[0].strip(), _label(cols[1], path, number, "label")))
    return out


def read_cola(path: str | Path) -> list[tuple[str, int]]:
    """GLUE CoLA TSV without a header: source, label, original mark, sentence."""
    path = Path(path)
    out = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 4:
            raise DataError(f"expected 4 tab-separated columns, got {len(cols)}", path, number)
        out.append((cols[3].strip(), _label(cols[1], path, number, "label")))
    return out


def read_story_cloze(path: str | Path) -> list[StoryClozeExample]:
    """Story Cloze 2016 CSV: id, 4 sentences, 2 endings, right ending (1 or 2); header skipped."""
    path = Path(path)
    rows = list(csv.reader(_read_text(path).splitlines()))
    out = []
    for number, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != 8:
            raise DataError(f"expected 8 comma-separated columns, got {len(row)}", path, number)
        if row[7].strip() not in ("1", "2"):
            raise DataError(f"expected 1 or 2, got {row[7]!r}", path, number, "AnswerRightEnding")
        out.append(StoryClozeExample(" ".join(s.strip() for s in row[1:5]),
                                     (row[5].strip(), row[6].strip()), int(row[7]) - 1))
    return out
