"""One outlier-rule module: the same robust rule through every caller, MAD = 0, shared names."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch
from scipy.stats import median_abs_deviation

from vitreg.analysis import attention, rules
from vitreg.analysis.attention import artifact_masks
from vitreg.analysis.rules import image_mask, robust_cut, robust_mask, robust_spread, threshold

# vitreg.neurons exports the function ``discover``, which hides the module of that name
discover = importlib.import_module("vitreg.neurons.discover")
detection = importlib.import_module("vitreg.neurons.detection")


def lognormal(b: int = 4, n: int = 64, seed: int = 0) -> torch.Tensor:
    """Positive values ``[b, n]`` with a few planted high ones per row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n, generator=g, dtype=torch.float64).exp()
    x[:, :3] *= 1000.0
    return x


def every_caller(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The robust rule on each row of ``x [B, N]`` through each place that applies it."""
    per_set = torch.stack([row > threshold(row.numpy(), "robust_z") for row in x])
    side = int(math.isqrt(x.shape[1]))
    return {
        "rules.robust_mask": robust_mask(x),
        "rules.image_mask": image_mask(x, "robust"),
        "discover.outlier_mask": discover.outlier_mask(x, "robust", None),
        "rules.threshold per row": per_set,
        "attention.artifact_masks": artifact_masks(x.view(-1, side, side)).flatten(1),
    }


def assert_all_equal(found: dict[str, torch.Tensor]) -> torch.Tensor:
    first_name, first = next(iter(found.items()))
    for name, mask in found.items():
        assert torch.equal(mask.cpu(), first.cpu()), f"{name} differs from {first_name}"
    return first


def test_same_robust_rule_through_every_caller() -> None:
    x = lognormal()
    mask = assert_all_equal(every_caller(x))
    assert mask[:, :3].all() and mask.sum() < 4 * 8  # the planted ones, few others
    # the statistic is scipy's normal-scaled MAD on log values
    logs = x.log().numpy()
    med = np.median(logs, axis=1, keepdims=True)
    sigma = median_abs_deviation(logs, axis=1, scale="normal")[:, None]
    assert torch.equal(mask, torch.from_numpy(logs > med + 3.5 * sigma))


def test_robust_z_threshold_is_the_row_cut_in_value_units() -> None:
    x = lognormal(1).numpy()[0]
    cut = robust_cut(np.log(x))[0]
    assert threshold(x, "robust_z") == pytest.approx(math.exp(cut), rel=1e-12)
    assert threshold(x, "robust_z", z=2.0) < threshold(x, "robust_z")


def test_mad_zero_when_half_the_values_are_equal() -> None:
    # 40 of 64 values equal: MAD 0; the mean absolute deviation stands in, so only the far
    # values are flagged (not every value above the median, not nothing)
    x = torch.ones(2, 64, dtype=torch.float64)
    x[:, 40:] = torch.linspace(1.05, 1.5, 24, dtype=torch.float64)
    x[:, -2:] = 50.0
    logs = x.log().numpy()
    assert (median_abs_deviation(logs, axis=1) == 0).all()
    spread = robust_spread(logs, axis=1)
    want = rules.MEAN_AD_SCALE * np.abs(logs - np.median(logs, 1, keepdims=True)).mean(1)
    assert np.allclose(spread[:, 0], want) and (spread > 0).all()
    mask = assert_all_equal(every_caller(x))
    assert mask[:, -2:].all() and mask.sum() == 4


def test_mad_zero_when_all_values_are_equal_flags_nothing() -> None:
    x = torch.full((3, 16), 7.0, dtype=torch.float64)
    mask = assert_all_equal(every_caller(x))
    assert not mask.any()
    assert threshold(x.numpy(), "robust_z") == math.inf
    assert np.isinf(robust_cut(np.log(x.numpy()), axis=1)).all()


def test_masks_keep_device_and_shape_and_empty_inputs() -> None:
    x = lognormal(2, 16).float()
    assert robust_mask(x).shape == x.shape and robust_mask(x).dtype == torch.bool
    assert robust_mask(torch.zeros(0, 16)).shape == (0, 16)
    assert artifact_masks(torch.zeros(0, 4, 4)).shape == (0, 4, 4)
    assert threshold(np.zeros(0), "robust_z") == math.inf


def test_other_rules_and_errors() -> None:
    x = lognormal(2, 16)
    assert torch.equal(image_mask(x, "absolute", 5.0), x > 5.0)
    assert torch.equal(image_mask(x, "auto", 5.0), x > 5.0)
    mean3 = x > x.mean(1, keepdim=True) + 3 * x.std(1, keepdim=True)
    assert torch.equal(image_mask(x, "mean3std"), mean3)
    with pytest.raises(ValueError, match="threshold must be one of"):
        image_mask(x, "top_p")
    with pytest.raises(ValueError, match="needs its threshold value"):
        image_mask(x, "absolute")
    with pytest.raises(ValueError, match="unknown outlier method"):
        threshold(x.numpy(), "robust")


def test_rule_names_are_one_shared_list() -> None:
    assert attention.threshold is rules.threshold
    assert detection.RULES is rules.MASK_RULES
    assert discover.THRESHOLDS is rules.MASK_RULES
    assert discover.outlier_mask is rules.image_mask
    assert set(rules.SET_RULES) | set(rules.MASK_RULES) == set(rules.RULES)
    assert set(rules.NAMED_THRESHOLDS) == set(rules.MASK_RULES) - {"absolute"}
    assert set(rules.PER_IMAGE_RULES) <= set(rules.MASK_RULES)
