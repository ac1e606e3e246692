"""SC-CLIP's LOF detector and its agreement with the norm outliers, by hand."""

from __future__ import annotations

import numpy as np
import torch

from vitreg.analysis.anomaly_lof import STRONG, agreement, lof_flags
from vitreg.results.kinds import LOFAgreement


def test_far_tokens_are_flagged_and_strong() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(97, 8))
    x[[5, 40, 77]] += 25.0  # three tokens far from the rest
    flagged, score = lof_flags(x)
    assert flagged.sum() == 5  # contamination 5% of 100 tokens
    assert set(np.flatnonzero(flagged)) >= {5, 40, 77}
    assert (score[[5, 40, 77]] >= STRONG).all()
    assert (np.delete(score, [5, 40, 77]) < STRONG).all()


def test_agreement_by_hand() -> None:
    flagged = torch.tensor([1, 1, 0, 0, 1, 0], dtype=torch.bool)
    auto = torch.tensor([1, 0, 0, 1, 1, 0], dtype=torch.bool)
    got = agreement(flagged, auto)
    assert isinstance(got, LOFAgreement)
    assert got.precision == 2 / 3 and got.recall == 2 / 3 and got.jaccard == 2 / 4
    none = agreement(flagged, torch.zeros(6, dtype=torch.bool))
    assert none.recall is None and none.precision == 0.0
