"""Readers for the multiple-choice datasets: Story Cloze 2016 (ROCStories) and RACE.

Story Cloze: the CSV header is `InputStoryid, InputSentence1..4, RandomFifthSentenceQuiz1,
RandomFifthSentenceQuiz2, AnswerRightEnding`; the story is the four sentences joined by spaces,
the two endings are the choices and the label is AnswerRightEnding - 1 (as OAI `datasets.py`).
GPT-1 fine-tunes on the 2016 *validation* file: `train` and `dev` are its original split
(scikit-learn `train_test_split`, test_size=374, random_state=3535999445 -> 1497 / 374, in the
order OAI used), `test` is the test file.

RACE: a folder `RACE/{train,dev,test}/{middle,high}/*.txt`, each file one JSON object with
`article`, `questions`, `options` (four per question) and `answers` (letters); one example per
question. A `{split}.jsonl` with one question per line (`article`, `question`, `options`,
`answer`, as the Hugging Face copy) is read too.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from gpt1.errors import DataError
from gpt1.tasks.examples import BadRows, ChoiceExample, Example
from gpt1.tasks.rows import (
    Record,
    check_field_sizes,
    collect,
    csv_records,
    jsonl_records,
    label_field,
    load_json,
    text_field,
)

STORY_CLOZE_VAL = ["cloze_test_val__spring2016 - cloze_test_ALL_val.csv", "*val*.csv"]
STORY_CLOZE_TEST = ["cloze_test_test__spring2016 - cloze_test_ALL_test.csv", "*test*.csv"]
STORY_CLOZE_DEV_SIZE, STORY_CLOZE_SEED = 374, 3535999445
RACE_LETTERS = ["A", "B", "C", "D"]


def read_story_cloze(path: Path, bad: BadRows) -> tuple[list[Example], int]:
    """All rows of one Story Cloze CSV file, in file order."""
    sentences = [f"InputSentence{i}" for i in range(1, 5)]

    def build(line: int, rec: Record) -> Example:
        story = " ".join(text_field(rec, c, path, line) for c in sentences)
        endings = [
            text_field(rec, c, path, line)
            for c in ("RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2")
        ]
        label = None
        if "AnswerRightEnding" in rec:
            label = label_field(rec, "AnswerRightEnding", path, line, ["1", "2"])
        return ChoiceExample(story, "", endings, label, rec.get("InputStoryid", str(line)))

    return collect(csv_records(path, bad), bad, build)


def story_cloze_split(examples: list[Example], split: str) -> list[Example]:
    """OAI's 1497/374 train/dev split of the validation file."""
    from sklearn.model_selection import train_test_split

    if len(examples) <= STORY_CLOZE_DEV_SIZE:
        raise DataError(
            f"the Story Cloze validation file has {len(examples)} usable rows; the "
            f"train/dev split needs more than {STORY_CLOZE_DEV_SIZE}"
        )
    train_idx, dev_idx = train_test_split(
        np.arange(len(examples)), test_size=STORY_CLOZE_DEV_SIZE, random_state=STORY_CLOZE_SEED
    )
    return [examples[i] for i in (train_idx if split == "train" else dev_idx)]


def _natural_key(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def read_race_file(path: Path) -> list[ChoiceExample]:
    """The questions of one RACE json file."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"not valid UTF-8 (byte {exc.start + 1} of the file)", path) from None
    except OSError as exc:
        raise DataError(f"cannot read file ({exc.strerror})", path) from None
    obj = load_json(text, path, None)
    if not isinstance(obj, dict):
        raise DataError("expected a JSON object", path)
    check_field_sizes(obj, path, None)
    article = text_field(obj, "article", path, None)  # type: ignore[arg-type]
    fields = {k: obj.get(k) for k in ("questions", "options", "answers")}
    for key, value in fields.items():
        if not isinstance(value, list):
            raise DataError(f"expected a list, got {type(value).__name__}", path, None, key)
    if not len(fields["questions"]) == len(fields["options"]) == len(fields["answers"]):
        raise DataError("questions, options and answers have different lengths", path)
    out = []
    for i, (q, opts, ans) in enumerate(
        zip(fields["questions"], fields["options"], fields["answers"])
    ):
        where = f"questions[{i}]"
        if (
            not isinstance(q, str)
            or not isinstance(opts, list)
            or not all(isinstance(o, str) for o in opts)
        ):
            raise DataError(
                "expected a question string and a list of option strings", path, None, where
            )
        if ans not in RACE_LETTERS[: len(opts)]:
            raise DataError(
                f"unknown answer {ans!r}; expected one of {', '.join(RACE_LETTERS[: len(opts)])}",
                path,
                None,
                f"answers[{i}]",
            )
        out.append(
            ChoiceExample(
                article, q, list(opts), RACE_LETTERS.index(ans), f"{obj.get('id', path.name)}-{i}"
            )
        )
    return out


def _same_options(
    examples: list[ChoiceExample], path: Path, first: tuple[int, str] | None
) -> tuple[int, str] | None:
    """Every question of a split has as many options as the first one read (its choices are
    scored as one softmax): a DataError naming this file's first question that has another
    number. Returns the first question's (options, file name)."""
    for i, example in enumerate(examples):
        if first is None:
            first = (len(example.choices), path.name)
        elif len(example.choices) != first[0]:
            raise DataError(
                f"{len(example.choices)} options where {first[1]} has {first[0]}",
                path,
                None,
                f"options[{i}]",
            )
    return first


def read_race(folder: Path, levels: tuple[str, ...], bad: BadRows) -> tuple[list[Example], int]:
    """All questions under `folder/<level>/*.txt` (or `*.json`) for each level."""
    out: list[Example] = []
    found = False
    first: tuple[int, str] | None = None
    for level in levels:
        files = sorted(
            [p for p in (folder / level).glob("*") if p.suffix in (".txt", ".json")],
            key=_natural_key,
        )
        found = found or bool(files)
        for path in files:
            try:
                examples = read_race_file(path)
                first = _same_options(examples, path, first)
            except DataError as exc:
                bad.report(exc)
                continue
            out.extend(examples)
    if not found:
        raise DataError(f"no RACE files in {', '.join(str(folder / l) for l in levels)}", folder)
    return out, 0


def read_race_jsonl(path: Path, levels: tuple[str, ...], bad: BadRows) -> tuple[list[Example], int]:
    """One question per line: article, question, options, answer (and optionally example_id)."""

    first: list[tuple[int, int]] = []  # the first question's (options, line)

    def build(line: int, rec: Record) -> Example | None:
        level = "high" if str(rec.get("example_id", "")).startswith("high") else "middle"
        if "example_id" in rec and level not in levels:
            return None
        options = rec.get("options")
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise DataError("expected a list of option strings", path, line, "options")
        if not first:
            first.append((len(options), line))
        elif len(options) != first[0][0]:
            raise DataError(
                f"{len(options)} options where line {first[0][1]} has {first[0][0]}",
                path,
                line,
                "options",
            )
        label = label_field(rec, "answer", path, line, RACE_LETTERS[: len(options)])
        return ChoiceExample(
            text_field(rec, "article", path, line),
            text_field(rec, "question", path, line, allow_empty=True),
            options,
            label,
            str(rec.get("example_id", line)),
        )

    return collect(jsonl_records(path, bad), bad, build)
