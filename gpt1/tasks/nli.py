"""Readers for the NLI datasets outside GLUE's own files: SNLI, MultiNLI extras and SciTail.

Formats (chosen by file name):
- SNLI/MNLI JSON Lines (`snli_1.0_dev.jsonl`, `multinli_1.0_dev_matched.jsonl`): `sentence1`,
  `sentence2`, `gold_label`; pairs labelled "-" (no annotator agreement) are left out and counted.
- Parallel-line files (InferSent/e-SNLI: `s1.dev`, `s2.dev`, `labels.dev`): line i of each file.
- TextFooler samples (`snli`, `mnli_matched`, `mnli_mismatched`): no header; label, premise,
  hypothesis.
- GLUE-style TSV (`train.tsv`, `dev_matched.tsv`): see `glue.py`.
- SciTail: AI2 leaderboard `answers.jsonl` (gold_label E/N), the release's `snli_format`
  JSON lines (`scitail_1.0_dev.txt`: entailment/neutral) and `tsv_format` (no header: premise,
  hypothesis, entails/neutral).
"""

from __future__ import annotations

from pathlib import Path

from gpt1.errors import DataError
from gpt1.tasks.examples import BadRows, Example, PairExample
from gpt1.tasks.files import not_a_regular_file
from gpt1.tasks.glue import GLUE_COLUMNS, read_glue_tsv
from gpt1.tasks.rows import (
    Record,
    check_field_sizes,
    collect,
    jsonl_records,
    label_field,
    numbered_lines,
    text_field,
    tsv_records,
)

NLI_LABELS = ["entailment", "neutral", "contradiction"]
SCITAIL_LABELS = ["entailment", "neutral"]
SCITAIL_ALIASES = {"E": "entailment", "N": "neutral", "entails": "entailment"}


def read_nli_jsonl(
    path: Path,
    labels: list[str],
    bad: BadRows,
    need_labels: bool,
    aliases: dict[str, str] | None = None,
) -> tuple[list[Example], int]:
    """SNLI/MNLI/SciTail JSON lines with sentence1, sentence2 and (optionally) gold_label."""

    def build(line: int, rec: Record) -> Example | None:
        a = text_field(rec, "sentence1", path, line)
        b = text_field(rec, "sentence2", path, line)
        label = None
        if "gold_label" in rec or need_labels:
            if str(rec.get("gold_label", "")).strip() == "-":
                return None
            label = label_field(rec, "gold_label", path, line, labels, aliases)
        uid = str(rec.get("pairID", rec.get("id", line)))
        return PairExample(a, b, label, uid)

    return collect(jsonl_records(path, bad), bad, build)


def read_headerless_nli(
    path: Path,
    order: tuple[str, str, str],
    labels: list[str],
    bad: BadRows,
    aliases: dict[str, str] | None = None,
) -> tuple[list[Example], int]:
    """Three tab-separated columns without a header, in `order` (names of label/premise/hypothesis)."""

    def build(line: int, rec: Record) -> Example:
        a = text_field(rec, "premise", path, line)
        b = text_field(rec, "hypothesis", path, line)
        return PairExample(a, b, label_field(rec, "label", path, line, labels, aliases), str(line))

    return collect(tsv_records(path, bad, names=list(order)), bad, build)


def read_parallel(s1: Path, labels: list[str], bad: BadRows) -> tuple[list[Example], int]:
    """`s1.X`, `s2.X`, `labels.X` side by side: line i of each is pair i."""
    split = s1.name[len("s1") :]  # ".dev"
    s2, lab = s1.with_name("s2" + split), s1.with_name("labels" + split)
    for f in (s2, lab):
        if not f.is_file():
            what = not_a_regular_file(f)
            raise DataError(
                f"parallel-line format needs {f.name} next to {s1.name}"
                + (f", and this {what}" if what else ""),
                f,
            )
    out: list[Example] = []
    dropped = 0
    streams = [numbered_lines(s1), numbered_lines(s2), numbered_lines(lab)]
    while True:
        rows = [next(s, None) for s in streams]
        if all(r is None for r in rows):
            break
        if any(r is None for r in rows):
            short = [f for f, r in zip((s1, s2, lab), rows) if r is None][0]
            line = next(r for r in rows if r is not None)[0]
            raise DataError(
                f"ends before line {line}: the three parallel files must have the "
                "same number of lines",
                short,
            )
        line = rows[0][0]
        rec = {"premise": rows[0][1].strip(), "hypothesis": rows[1][1].strip(), "label": rows[2][1]}
        try:
            check_field_sizes(rec, s1, line)
            if rec["label"].strip() == "-":
                dropped += 1
                continue
            a = text_field(rec, "premise", s1, line)
            b = text_field(rec, "hypothesis", s2, line)
            out.append(PairExample(a, b, label_field(rec, "label", lab, line, labels), str(line)))
        except DataError as exc:
            bad.report(exc)
    return out, dropped


def read_nli_file(
    path: Path,
    task: str,
    labels: list[str],
    bad: BadRows,
    need_labels: bool,
    aliases: dict[str, str] | None = None,
) -> tuple[list[Example], int]:
    """Dispatch on the file's name to the reader of its format."""
    name = path.name
    if name.startswith("s1."):
        return read_parallel(path, labels, bad)
    if name in ("snli", "mnli_matched", "mnli_mismatched"):
        return read_headerless_nli(path, ("label", "premise", "hypothesis"), labels, bad, aliases)
    if path.suffix in (".jsonl", ".json") or (
        name.startswith("scitail_1.0") and path.suffix == ".txt"
    ):
        return read_nli_jsonl(path, labels, bad, need_labels, aliases)
    if name.startswith("scitail_1.0") and path.suffix == ".tsv":
        return read_headerless_nli(path, ("premise", "hypothesis", "label"), labels, bad, aliases)
    columns = GLUE_COLUMNS["snli" if task in ("snli", "scitail") else "mnli"]
    return read_glue_tsv(path, columns, labels, bad, need_labels, aliases)


def snli_candidates(split: str) -> list[str]:
    extra = ["snli"] if split == "test" else []  # the TextFooler sample is from SNLI test
    return [f"snli_1.0_{split}.jsonl", f"s1.{split}", f"{split}.tsv", f"{split}.jsonl"] + extra


def mnli_candidates(split: str) -> list[str]:
    extra = {"dev_matched": ["mnli_matched"], "dev_mismatched": ["mnli_mismatched"]}.get(split, [])
    return [f"{split}.tsv", f"multinli_1.0_{split}.jsonl", f"{split}.jsonl"] + extra


def scitail_candidates(split: str) -> list[str]:
    return [
        f"{split}/answers.jsonl",
        f"scitail_1.0_{split}.txt",
        f"snli_format/scitail_1.0_{split}.txt",
        f"scitail_1.0_{split}.tsv",
        f"tsv_format/scitail_1.0_{split}.tsv",
        f"{split}.jsonl",
        f"{split}.tsv",
    ]
