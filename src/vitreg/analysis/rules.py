"""Outlier rules: the one list of rule names, one robust z-score, the per-set cut, the masks.

Every place that flags outlier tokens (the norm analysis, attention artifacts, register-neuron
detection and discovery, the causal check, the fix comparison, ``vitreg neurons --threshold``)
takes its rule names and its statistics from here.

Rules (:data:`RULES`):

- ``auto``: over a set of norms, the valley of a two-component Gaussian mixture fitted to log
  norms, only when the distribution is really bimodal (:func:`~vitreg.analysis.thresholds.
  bimodal_fit`), else nothing is flagged; on a batch, ``norm > value`` with that valley computed
  beforehand (the neurons' detection layer);
- ``absolute``: ``norm > value`` (Darcet's hand-picked 150 for DINOv2-g);
- ``top_p``: over a set, the top p% (the reassessment's 98th percentile; flags p% of *every*
  model);
- ``robust_z`` (over a set) and ``robust`` (per image: each row of a ``[B, N]`` batch): the
  robust z-score rule, log value above median + z * sigma (Iglewicz-Hoaglin modified z-score,
  z = 3.5 by default), one implementation, :func:`robust_cut`;
- ``mean3std`` (per image): norm > mean + 3 std of the image's tokens (Jiang et al., A.4).

The robust sigma is ``scipy.stats.median_abs_deviation(scale="normal")`` (1.4826 x MAD). When
more than half of the values are equal, the MAD is 0; then 1.2533 x the mean absolute deviation
from the median (sqrt(pi/2), the usual modified z-score fallback) stands in for it, and when that
is 0 too (every value equal) the rule flags nothing.

Changes from the three copies this module replaced, all where the MAD is 0: the set rule
``robust_z`` flagged nothing there and now uses the fallback; the per-image ``robust`` rule of
neuron discovery flagged every token above the median there (its cut was the median itself) and
now uses the fallback; the attention artifacts already used it (unchanged). The per-image
``robust`` rule also now takes the median as numpy does (the mean of the two middle values for
an even token count) where torch took the lower one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from vitreg.analysis.thresholds import bimodal_fit
from vitreg.core.choices import (  # noqa: F401  (the rules' vocabulary, re-exported)
    MASK_RULES,
    NAMED_THRESHOLDS,
    PER_IMAGE_RULES,
    RULES,
    SET_RULES,
)
from vitreg.errors import InputError

assert {*SET_RULES, *MASK_RULES} == set(RULES), "every rule subset is taken from RULES"

Z_CUT = 3.5
MAD_SCALE = 1.4826  # 1 / Phi^-1(3/4): what median_abs_deviation(scale="normal") multiplies by
MEAN_AD_SCALE = math.sqrt(math.pi / 2)  # 1.2533: mean absolute deviation -> sigma
LOG_FLOOR = 1e-12  # values are clipped here before the log


def robust_spread(x: np.ndarray, axis: int | None = None) -> np.ndarray:
    """Robust sigma of ``x`` along ``axis`` (kept as a size-1 dim; ``None``: all values).

    1.4826 x MAD; where the MAD is 0, 1.2533 x the mean absolute deviation from the median;
    0 where every value is equal.
    """
    from scipy.stats import median_abs_deviation

    x = np.asarray(x, dtype=np.float64)
    if axis is None:
        x, axis = x.reshape(-1), 0
    med = np.median(x, axis=axis, keepdims=True)
    mad = np.expand_dims(median_abs_deviation(x, axis=axis, scale="normal"), axis)
    mean_ad = MEAN_AD_SCALE * np.abs(x - med).mean(axis=axis, keepdims=True)
    return np.where(mad > 0, mad, mean_ad)


def robust_cut(x: np.ndarray, z: float = Z_CUT, axis: int | None = None) -> np.ndarray:
    """``median + z * sigma`` of ``x`` along ``axis`` (kept as a size-1 dim), ``+inf`` where
    sigma is 0 (a constant set flags nothing). See :func:`robust_spread`."""
    x = np.asarray(x, dtype=np.float64)
    if axis is None:
        x, axis = x.reshape(-1), 0
    spread = robust_spread(x, axis)
    med = np.median(x, axis=axis, keepdims=True)
    return np.where(spread > 0, med + z * spread, np.inf)


def _logs(values: Any, floor: float) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    return np.log(np.clip(np.asarray(values, dtype=np.float64), floor, None))


def robust_threshold(values: Any, z: float = Z_CUT, floor: float = LOG_FLOOR) -> float:
    """The value above which the robust z-score rule on log values flags, over all of
    ``values`` (``inf``: flags nothing)."""
    logs = _logs(values, floor).reshape(-1)
    if not logs.size:
        return math.inf
    return float(np.exp(robust_cut(logs, z)[0]))


def robust_mask(values: torch.Tensor, z: float = Z_CUT, floor: float = LOG_FLOOR) -> torch.Tensor:
    """Bool like ``values [..., N]``: log value above its row's median + z * sigma (each row of
    the last dim on its own, e.g. the tokens of one image)."""
    logs = _logs(values, floor)
    if not logs.size:
        return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    mask = logs > robust_cut(logs, z, axis=-1)
    return torch.from_numpy(mask).to(values.device)


def mean3std_mask(norms: torch.Tensor) -> torch.Tensor:
    """Bool like ``norms [B, N]``: above the image's mean + 3 std (Jiang et al., A.4)."""
    return norms > norms.mean(1, keepdim=True) + 3 * norms.std(1, keepdim=True)


def image_mask(
    norms: torch.Tensor, rule: str, value: float | None = None, z: float = Z_CUT
) -> torch.Tensor:
    """``[B, N]`` outlier mask from per-token norms under a :data:`MASK_RULES` rule.

    ``auto``/``absolute`` flag ``norm > value`` (for ``auto`` the valley found beforehand, see
    :func:`threshold`); ``mean3std`` and ``robust`` cut each image on its own.
    """
    if rule in ("auto", "absolute"):
        if value is None:
            raise InputError(f"the {rule!r} rule needs its threshold value in norm units")
        return norms > value
    if rule == "mean3std":
        return mean3std_mask(norms)
    if rule == "robust":
        return robust_mask(norms, z)
    raise InputError(f"threshold must be one of {MASK_RULES} or a number, got {rule!r}")


def threshold(norms: Any, method: str, **params: float) -> float:
    """The norm above which a :data:`SET_RULES` rule flags a token of the pooled ``norms``
    (``inf``: flags nothing)."""
    x = np.asarray(norms, dtype=np.float64).ravel()
    if method == "absolute":
        if "value" not in params:
            raise ValueError("the absolute rule needs a threshold value (e.g. value=150)")
        return float(params["value"])
    if method == "top_p":
        p = float(params.get("p", 2.0))
        if not 0 < p < 100:
            raise ValueError(f"top_p takes a percentage in (0, 100), got {p}")
        return float(np.quantile(x, 1 - p / 100)) if x.size else math.inf
    if method == "robust_z":
        return robust_threshold(x, float(params.get("z", Z_CUT)))
    if method == "auto":
        return bimodal_fit(x).cut
    raise ValueError(f"unknown outlier method {method!r}; choose from {SET_RULES}")


# A fix leaves no artifact when no block shows an outlier mode and the max/median patch norm is
# within this factor of the ordinary (non-outlier) patches' max/median before the fix.
FIX_TOLERANCE = 1.5


def ordinary_level(patches: torch.Tensor, flagged: torch.Tensor) -> float:
    """Max/median norm of the patches not flagged as outliers (all of them if every one is),
    both taken over those patches: the level a fix should bring the largest patch norms back
    to, and never below 1 (the same statistic as a model's max/median, on ordinary patches)."""
    normal = patches[~flagged]
    normal = normal if normal.numel() else patches.flatten()
    return float(normal.max()) / max(float(normal.median()), 1e-12)


def fix_is_clean(
    blocks_with_mode: list[int],
    max_over_median: float,
    ordinary: float | None,
    tolerance: float = FIX_TOLERANCE,
) -> bool:
    """A fix leaves no artifact: no block with an outlier mode, and the max/median patch norm
    within ``tolerance`` x the ordinary level (when it is known)."""
    return not blocks_with_mode and (ordinary is None or max_over_median <= tolerance * ordinary)
