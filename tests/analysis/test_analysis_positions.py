"""Position-consistency score by hand."""

from __future__ import annotations

import pytest
import torch

from vitreg.analysis.positions import consistency


def test_consistency_by_hand() -> None:
    hits = torch.zeros(10, 6, dtype=torch.bool)
    hits[:, 0] = True  # position 0 in every image
    hits[:9, 5] = True  # position 5 in 9 of 10 images (90%: consistent)
    hits[0, 2] = hits[3, 3] = True  # content-tied stragglers
    rate, score = consistency(hits)
    assert rate.tolist() == pytest.approx([1.0, 0.0, 0.1, 0.1, 0.0, 0.9])
    assert score == 19 / 21


def test_content_tied_outliers_score_zero() -> None:
    hits = torch.eye(6, dtype=torch.bool)  # each image its own outlier position
    assert consistency(hits)[1] == 0.0
    assert consistency(torch.zeros(4, 3, dtype=torch.bool))[1] == 0.0
