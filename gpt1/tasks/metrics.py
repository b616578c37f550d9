"""Task metrics as GLUE reports them, computed by scikit-learn and scipy.

accuracy, F1 of the positive class (MRPC, QQP, binary user tasks; `positive` is its class index,
1 unless the task names another), Matthews correlation (CoLA), Pearson and
Spearman correlation (STS-B). Values are fractions in [0, 1] (correlations in [-1, 1]).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def compute(
    names: Sequence[str],
    predictions: Sequence[float],
    labels: Sequence[float],
    positive: int = 1,
) -> dict[str, float]:
    """The metrics `names` of `predictions` against `labels` (class indices or scores); F1 is
    that of class index `positive`."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    y_pred, y_true = np.asarray(predictions), np.asarray(labels)
    if len(y_pred) != len(y_true) or len(y_true) == 0:
        raise ValueError(
            f"need equal, non-zero numbers of predictions and labels "
            f"({len(y_pred)} vs {len(y_true)})"
        )
    out: dict[str, float] = {}
    for name in names:
        if name == "accuracy":
            out[name] = float(accuracy_score(y_true, y_pred))
        elif name == "f1":
            out[name] = float(f1_score(y_true, y_pred, pos_label=positive, zero_division=0))
        elif name == "matthews":
            out[name] = float(matthews_corrcoef(y_true, y_pred))
        elif name in ("pearson", "spearman"):
            if np.std(y_pred) == 0 or np.std(y_true) == 0:
                out[name] = 0.0  # correlation undefined for a constant; report no correlation
            else:
                fn = pearsonr if name == "pearson" else spearmanr
                out[name] = float(fn(y_pred, y_true)[0])
        else:
            raise ValueError(f"unknown metric {name!r}")
    return out
