"""SC-CLIP's LOF detector and its agreement with the norm outliers, by hand."""

from __future__ import annotations

import numpy as np
import torch

from vitreg.analysis.anomaly_lof import STRONG, PatchSample, agreement, lof_flags
from vitreg.core.layout import TokenLayout
from vitreg.hooks.sites import HookContext
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


def test_the_sample_keeps_the_first_images_patches_by_image() -> None:
    layout = TokenLayout(1, 0, (3, 3), (14, 14))  # [CLS] + 9 patches
    x = torch.randn(5, layout.n_tokens, 4, generator=torch.Generator().manual_seed(0))
    sample = PatchSample("blocks.0.hook_resid_post", max_images=3, max_tokens=4)
    ctx = HookContext(sample.site, 0, layout)
    sample(x[2:], ctx, 2)  # the later images first
    sample(x[:2], ctx, 0)
    kept = sample.result()["kept"]
    assert list(kept) == [0, 1, 2]  # image order, max_images only
    for image, (index, tokens) in kept.items():
        assert len(index) == 4 and index.tolist() == sorted(index.tolist())
        assert torch.equal(tokens, layout.take(x, "patches")[image, index])
