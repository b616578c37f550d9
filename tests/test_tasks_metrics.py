"""Metrics per task as GLUE reports them (values worked out by hand here)."""

from __future__ import annotations

import math

import pytest

from gpt1.tasks.metrics import compute
from gpt1.tasks.registry import get_task


def test_classification_metrics():
    m = compute(["accuracy", "f1", "matthews"], [1, 1, 0, 0], [1, 0, 0, 0])
    assert m["accuracy"] == 0.75
    assert m["f1"] == pytest.approx(2 / 3)  # P = 1/2, R = 1
    assert m["matthews"] == pytest.approx(2 / math.sqrt(12))


def test_correlations():
    m = compute(["pearson", "spearman"], [1.0, 2.0, 3.0, 10.0], [2.0, 4.0, 6.0, 8.0])
    assert m["spearman"] == pytest.approx(1.0)
    assert 0.8 < m["pearson"] < 1.0
    assert compute(["pearson"], [1.0, 1.0], [0.0, 1.0])["pearson"] == 0.0


def test_task_metrics_follow_glue():
    assert get_task("cola").metrics[0] == "matthews"
    assert get_task("mrpc").metrics[:2] == ("f1", "accuracy")
    assert get_task("qqp").metrics[:2] == ("f1", "accuracy")
    assert get_task("stsb").metrics == ("pearson", "spearman") and get_task("stsb").regression
    assert get_task("sst2").metrics == ("accuracy",)
    assert get_task("race").kind == "choice" and get_task("story_cloze").n_outputs == 1
    assert get_task("mnli").n_outputs == 3


def test_metric_input_errors():
    with pytest.raises(ValueError):
        compute(["accuracy"], [], [])
    with pytest.raises(ValueError):
        compute(["bleu"], [1], [1])
