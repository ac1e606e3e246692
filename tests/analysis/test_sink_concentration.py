"""The sink concentration ratio r = max_j c_j / median_j c_j: against a hand computation, against
its closed form on a planted logit, and on the kinds plants (the planted head is the only
concentrated one)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import vitreg
from vitreg.analysis.base import run_analyses
from vitreg.analysis.sink_concentration import (
    concentrated_heads,
    concentration_ratio,
    summarise_concentration,
)
from vitreg.analysis.sink_rules import head_stats, sqrt_psd
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.errors import InputError
from vitreg.testing.planted import build_kind


def _stats(a: torch.Tensor):
    b, h, n, _ = a.shape
    v = torch.randn(b, n, h, 4, generator=torch.Generator().manual_seed(3))
    metric = torch.eye(4).expand(h, 4, 4).clone()
    return head_stats(a, v, metric, lambda: sqrt_psd(metric))


@pytest.mark.parametrize("n", [7, 8])  # odd and even key counts (the even median averages two)
def test_ratio_matches_a_hand_computation(n: int) -> None:
    logits = torch.randn(3, 2, n, n, generator=torch.Generator().manual_seed(n))
    a = logits.softmax(-1)
    got = _stats(a).concentration
    for i in range(3):
        for h in range(2):
            c = a[i, h].sum(0).numpy()  # column sums over all queries
            assert float(got[i, h]) == pytest.approx(c.max() / np.median(c), rel=1e-5)


def test_ratio_of_one_planted_logit_is_its_exponential() -> None:
    # every query gives the sink key logit L and every other key 0: c_s / c_j = e^L exactly
    n, big = 10, 5.0
    logits = torch.zeros(1, 1, n, n)
    logits[..., 3] = big
    r = float(_stats(logits.softmax(-1)).concentration[0, 0])
    assert r == pytest.approx(math.exp(big), rel=1e-5)
    uniform = torch.full((1, 1, n, n), 1.0 / n)
    assert float(concentration_ratio(uniform.sum(-2))[0, 0]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "name,planted",
    [("kinds_nop_sink", [(2, 1)]), ("kinds_broadcast_sink", [(3, 2)]), ("kinds_clean", [])],
)
def test_plants_are_the_only_concentrated_heads(name: str, planted: list) -> None:
    model = vitreg.wrap(build_kind(name)[0])
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    res, _, _ = run_analyses(model, x, [SinkAnalysis()], batch_size=2)
    conc = res["sinks"].concentration
    assert conc.blocks == list(range(6)) and all(len(row) == 4 for row in conc.mean)
    found = [(b, h) for b, h, _ in concentrated_heads(conc, 1000.0)]
    assert found == planted  # planted: ~1e6; every random head stays below 100
    assert max(max(row) for row in conc.max) < 1000.0 or planted
    if planted:
        assert (conc.peak_block, conc.peak_head) == planted[0] and conc.peak > 1e5


def test_bad_input_is_a_named_error() -> None:
    conc = summarise_concentration([0], [torch.tensor([[2.0, 3.0]])])
    assert conc.mean == [[2.0, 3.0]] and conc.peak_head == 1
    for bad in (0.5, float("nan"), float("inf")):
        with pytest.raises(InputError, match=">= 1"):
            concentrated_heads(conc, bad)
    with pytest.raises(InputError, match="at least one pattern"):
        summarise_concentration([], [])


def test_graded_plant_ratios_are_the_planted_logits() -> None:
    module, truth = build_kind("kinds_graded_sinks")
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    res, _, _ = run_analyses(vitreg.wrap(module), x, [SinkAnalysis()], batch_size=2)
    log_r = np.log(np.array(res["sinks"].concentration.mean))
    planted = {(b, h): logit for b, h, logit in truth.logits}
    assert len(planted) == 3
    for (b, h), logit in planted.items():  # every query gives [CLS] e^logit, the others ~1
        assert abs(log_r[b, h] - logit) < 0.25
    others = [log_r[b, h] for b in range(6) for h in range(4) if (b, h) not in planted]
    assert max(others) < 1.5
