"""A probe's pieces are the results models metrics.json holds: a task's scores, yardsticks and
details are built typed, a task's result is the layer model (its example predictions beside
it, never in the file), and the old names still import for one release."""

from __future__ import annotations

import math

import pytest
import torch

from vitreg.probe.tasks import TaskResult, score_over_seeds
from vitreg.probe.verdicts import yardstick_verdicts
from vitreg.probe.yardsticks import discovery, yardstick
from vitreg.results.probe import ProbeLayer, ProbeScore, ProbeYardstick, TaskInfo


def test_a_score_is_the_typed_score_with_its_mean_and_interval() -> None:
    s = score_over_seeds("cls", "top1", [0.5, 0.7, math.nan], True, n_test=10, lrs=[1e-3])
    assert isinstance(s, ProbeScore)
    assert s.values == [0.5, 0.7, None] and s.n_test == 10 and s.group == "all"
    assert s.mean is None or math.isfinite(s.mean)
    clean = score_over_seeds("cls", "top1", [0.5, 0.7], True)
    assert clean.mean == pytest.approx(0.6) and clean.ci95 is not None and clean.lrs == []


def test_a_yardstick_without_a_finite_value_records_none() -> None:
    (whole,) = discovery([], (8, 8))  # no box to score: no value
    assert isinstance(whole, ProbeYardstick) and whole.value is None
    assert yardstick("chance", "top1", 0.25, "uniform").value == 0.25


def test_a_task_result_is_the_layer_model_with_its_examples_beside_it() -> None:
    examples = {"target": torch.zeros(2, 4, 4, dtype=torch.long)}
    scores = [score_over_seeds("patch", "miou", [0.40, 0.41, 0.42], True, n_test=2)]
    marks = [yardstick("majority class", "miou", 0.9, "always class 0")]
    result = TaskResult("segmentation", "blocks.0", scores, [], TaskInfo(num_classes=3),
                        marks, examples)  # fmt: skip
    assert isinstance(result, ProbeLayer) and result.examples["target"].shape == (2, 4, 4)
    judged = yardstick_verdicts(result)
    assert judged.scores[0].vs_yardsticks == {"majority class": "worse"}
    assert judged.examples is result.examples  # the copy keeps the predictions for figures
    assert result.scores[0].vs_yardsticks == {}  # the task's own result is left as it was
    dumped = result.model_dump(mode="json")
    assert "examples" not in dumped and dumped["info"] == {"num_classes": 3}


def test_the_old_names_still_import_with_a_warning() -> None:
    import vitreg.probe.tasks as tasks
    import vitreg.probe.yardsticks as yardsticks

    with pytest.warns(DeprecationWarning, match="ProbeScore"):
        assert tasks.Score is ProbeScore
    with pytest.warns(DeprecationWarning, match="ProbeYardstick"):
        assert yardsticks.Yardstick is ProbeYardstick
