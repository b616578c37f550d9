"""Turning sweep results into what the analyses publish: mean +- std, markdown tables, JSON files.

Values are stored as fractions (accuracy 0.913) and shown in the paper's style, as percentages
with one decimal (91.3); correlations are shown x 100 as well, as the paper does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpt1 import files


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value; nan for none)."""
    vals = [float(v) for v in values]
    if not vals:
        return float("nan"), float("nan")
    mean = sum(vals) / len(vals)
    if len(vals) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


def pct(value: float, std: float | None = None) -> str:
    """91.3 or 91.3 ± 0.4 from fractions; '–' for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.1f}"
    return f"{text} ± {100 * std:.1f}" if std else text


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a reader never sees half a file; a failed write leaves none)."""
    files.write_json(path, data)


def write_text(path: Path, text: str) -> None:
    """Write a Markdown table (or any text) atomically."""
    files.write_text(path, text)


def save_figure(fig: Any, path: Path) -> None:
    """Write a figure as PNG atomically."""
    from gpt1.train.telemetry import save_figure as save

    save(fig, path)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
