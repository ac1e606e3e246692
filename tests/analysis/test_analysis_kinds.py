"""Every kind detector on every kinds plant: each recovers its own plant exactly and stays silent
on the others and on the clean models (one pass per plant through the issue-20 analyses)."""

from __future__ import annotations

import pytest
import torch

import vitreg
from vitreg.analysis.anomaly_lof import LOFAnalysis
from vitreg.analysis.base import run_analyses
from vitreg.analysis.kinds import verdicts
from vitreg.analysis.massive import MassiveAnalysis
from vitreg.analysis.norms import NormAnalysis
from vitreg.analysis.positions import PositionAnalysis
from vitreg.analysis.registers import RegisterAnalysis
from vitreg.analysis.sinks import SinkAnalysis
from vitreg.results.kinds import Kinds
from vitreg.testing.planted import build_kind

EXPECTED = {
    "kinds_clean": set(),
    "kinds_clean_reg4": set(),
    "kinds_nop_sink": {"NOP sinks"},
    "kinds_broadcast_sink": {"broadcast sinks"},
    # the planted positions are high-norm outliers, tied to position, and LOF anomalies
    "kinds_position": {"high-norm outliers", "position-tied", "LOF anomaly tokens"},
    "kinds_massive": {"massive activations"},
    "kinds_registers": {"NOP sinks", "registers absorbed the artifacts"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_detector_recovers_its_plant_and_only_it(name: str) -> None:
    module, truth = build_kind(name)
    model = vitreg.wrap(module)
    x = torch.randn(6, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    chosen = [NormAnalysis(), SinkAnalysis(), MassiveAnalysis(), LOFAnalysis()]
    chosen += [PositionAnalysis(), RegisterAnalysis()]
    res, skipped, _ = run_analyses(model, x, chosen, batch_size=3)
    kinds = verdicts(res, skipped)
    assert isinstance(kinds, Kinds)
    assert set(kinds.present) == EXPECTED[name]
    assert kinds.row("attention artifacts").present is None  # not run here, and said so

    found = {(h.block, h.head, h.kind, h.key_type) for h in res["sinks"].heads}
    assert found == {(s.block, s.head, s.kind, s.key_type) for s in truth.sinks}
    assert res["sinks"].per_image.total == len(truth.sinks)

    massive = {(min(c.blocks), *c.token_types, c.channel) for c in res["massive"].channels}
    assert massive == {(b, t, c) for b, t, _, c in truth.massive}

    grid = {r * 8 + c for r, c in res["positions"].positions if res["positions"].present}
    assert grid == set(truth.positions)
    if truth.positions:
        pos = res["positions"]
        assert pos.consistency_score == 1.0
        embedding = pos.position_embedding
        assert {r * 8 + c for r, c in embedding.high_positions} == set(truth.positions)
        assert embedding.top_channel_share_of_high > 0.9
        assert all(
            {r * 8 + c for r, c in p} == set(truth.positions) for p in pos.constant_images.values()
        )

    absorbed = res["registers"].absorbed
    assert absorbed is (None if model.layout.n_reg == 0 else truth.registers_absorb)
