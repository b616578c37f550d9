"""Readers for the GLUE TSV files, one column spec per task, with each task's quirks.

- CoLA train/dev have no header (source, label, mark, sentence); its test has `index, sentence`.
- SST-2: `sentence, label`; STS-B: ten columns, the float score last (test: nine, no score).
- QNLI: `index, question, sentence, label`; RTE/WNLI: `index, sentence1, sentence2, label`.
- MRPC: `Quality, #1 ID, #2 ID, #1 String, #2 String` (test: `index` instead of `Quality`).
- QQP: `id, qid1, qid2, question1, question2, is_duplicate` (test: `id, question1, question2`).
- MNLI (and GLUE-style SNLI): `sentence1, sentence2` by header, the gold label is the row's LAST
  field because dev rows carry five annotator labels under a header that names one.
Test files have no label column: their examples have `label=None`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpt1.errors import DataError
from gpt1.tasks.examples import BadRows, Example, PairExample, TextExample
from gpt1.tasks.files import SEPARATORS
from gpt1.tasks.rows import (
    Record,
    collect,
    label_field,
    records,
    table_header,
    text_field,
)


@dataclass(frozen=True)
class GlueColumns:
    """Column names of one GLUE task's TSV files."""

    text: tuple[str, ...]  # one column (single text) or two (pair)
    label: str | None  # None: the task's files never have labels
    ids: tuple[str, ...] = ("index", "id")  # first present column is the example id
    headerless: tuple[str, ...] | None = None  # names for files without a header (CoLA)
    label_last: bool = False  # the label is the row's last field (MNLI/SNLI)


GLUE_COLUMNS: dict[str, GlueColumns] = {
    "cola": GlueColumns(("sentence",), "label", headerless=("source", "label", "mark", "sentence")),
    "sst2": GlueColumns(("sentence",), "label"),
    "stsb": GlueColumns(("sentence1", "sentence2"), "score"),
    "qnli": GlueColumns(("question", "sentence"), "label"),
    "rte": GlueColumns(("sentence1", "sentence2"), "label"),
    "wnli": GlueColumns(("sentence1", "sentence2"), "label"),
    "mrpc": GlueColumns(("#1 String", "#2 String"), "Quality"),
    "qqp": GlueColumns(("question1", "question2"), "is_duplicate"),
    "mnli": GlueColumns(("sentence1", "sentence2"), "gold_label", label_last=True),
    "snli": GlueColumns(("sentence1", "sentence2"), "gold_label", label_last=True),
}


def read_glue_tsv(
    path: Path,
    columns: GlueColumns,
    labels: list[str] | None,
    bad: BadRows,
    need_labels: bool,
    aliases: dict[str, str] | None = None,
) -> tuple[list[Example], int]:
    """Examples of one GLUE TSV file. `labels` None means a float score (STS-B).

    Rows whose label is "-" (SNLI/MNLI pairs without annotator agreement) are left out and
    counted, as every published SNLI/MNLI number does.
    """
    first, separator = table_header(path)
    names = None
    if columns.headerless and not set(columns.text) <= set(first):
        names = list(columns.headerless)
    header = names or first
    # what was read, for the errors: the separator and the columns it gave
    read = (
        f"the header read as {SEPARATORS[separator]}-separated (by "
        f"{'its extension' if path.suffix.lower() in ('.csv', '.tsv') else 'its first line'}) "
        f"gives {len(header)} column{'s' if len(header) != 1 else ''}: {header!r}"
    )
    missing = [c for c in columns.text if c not in header]
    if missing:
        raise DataError(
            f"no column {missing[0]!r}: {read}; is this the right task?", path, 1, missing[0]
        )
    has_label = columns.label is not None and columns.label in header
    if need_labels and not has_label:
        raise DataError(f"no label column {columns.label!r}: {read}", path, 1, columns.label)
    id_col = next((c for c in columns.ids if c in header), None)
    extra = columns.label if columns.label_last and has_label else None

    def build(line: int, rec: Record) -> Example | None:
        texts = [text_field(rec, c, path, line) for c in columns.text]
        label = None
        if has_label:
            if columns.label_last and rec[columns.label].strip() == "-":
                return None
            label = label_field(
                rec, columns.label, path, line, labels, aliases, required=need_labels
            )
        uid = rec[id_col] if id_col else str(line)
        if len(texts) == 1:
            return TextExample(texts[0], label, uid)
        return PairExample(texts[0], texts[1], label, uid)

    return collect(records(path, bad, names=names, extra_last=extra), bad, build)
