"""The presence test that can say "none": a two-Gaussian fit of log10 norms (the ``auto`` rule).

The outlier rules on a set of token norms, side by side:

- ``absolute``: norm > a given value (Darcet's hand-picked 150 for DINOv2-g).
- ``top_p``: the top p% (the reassessment's 98th percentile; flags p% of *every* model).
- ``robust_z``: log-norm above median + z * 1.4826 * MAD (Iglewicz-Hoaglin modified z-score;
  with MAD 0, 1.2533 x the mean absolute deviation, see :mod:`vitreg.analysis.rules`).
- ``auto``: the valley of a two-component Gaussian mixture fitted to log10 norms, used only
  when the distribution is really bimodal (see :func:`bimodal_fit`), else nothing is flagged.

The rule names (``SET_RULES``) and ``threshold`` live in :mod:`vitreg.analysis.rules` (shared
with attention artifacts and register neurons), which calls :func:`bimodal_fit` for ``auto``.
"""

from __future__ import annotations

import math

import numpy as np

from vitreg.core.renamed import renamed
from vitreg.results.diagnose import Bimodal

__all__ = ["Bimodal", "bimodal_fit"]

# presence criteria for a bimodal split of log10 norms (documented in the report)
MIN_BIC_GAIN = 10.0  # two Gaussians must beat one by this much BIC
MIN_ASHMAN_D = 2.0  # modes separated by more than their spread (D > 2: clean separation)
MAX_UPPER_WEIGHT = 0.3  # outliers are a minority of tokens
MIN_MODE_RATIO = 3.0  # outlier mode's median norm over the bulk's median norm


def _fit(present: bool, threshold: float, *values: float) -> Bimodal:
    """The fit as its results model: an infinite or undefined number is ``None``."""
    names = [n for n in Bimodal.model_fields if n not in ("present", "threshold")]
    finite = {n: (v if math.isfinite(v) else None) for n, v in zip(names, values, strict=True)}
    return Bimodal(
        present=present, threshold=threshold if math.isfinite(threshold) else None, **finite
    )


def _gauss_loglik(
    x: np.ndarray, mean: np.ndarray, std: np.ndarray, weight: np.ndarray
) -> np.ndarray:
    std = np.maximum(std, 1e-6)
    z = (x[:, None] - mean[None]) / std[None]
    return np.log(weight[None] + 1e-300) - 0.5 * z * z - np.log(std[None] * math.sqrt(2 * math.pi))


def _otsu_split(x: np.ndarray) -> float:
    """Threshold maximising between-class variance over quantile candidates (EM initialisation)."""
    candidates = np.unique(np.quantile(x, np.linspace(0.5, 0.999, 120)))
    best, best_t = -1.0, float(np.median(x))
    for t in candidates:
        hi = x > t
        w1 = hi.mean()
        if w1 <= 0 or w1 >= 1:
            continue
        between = w1 * (1 - w1) * (x[hi].mean() - x[~hi].mean()) ** 2
        if between > best:
            best, best_t = between, float(t)
    return best_t


def bimodal_fit(norms: np.ndarray, max_samples: int = 200_000, seed: int = 0) -> Bimodal:
    """Fit 1 vs 2 Gaussians to log10 norms by EM; ``present`` when the criteria above all hold."""
    x = np.log10(np.clip(np.asarray(norms, dtype=np.float64).ravel(), 1e-12, None))
    if x.size > max_samples:
        x = np.random.default_rng(seed).choice(x, max_samples, replace=False)
    n = x.size
    if n < 8 or np.ptp(x) < 1e-9:
        m = float(x.mean()) if n else 0.0
        return _fit(False, math.inf, m, m, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    t = _otsu_split(x)
    hi = x > t
    mean = np.array([x[~hi].mean(), x[hi].mean()])
    std = np.array([x[~hi].std() + 1e-3, x[hi].std() + 1e-3])
    weight = np.array([1 - hi.mean(), hi.mean()])
    mean, std, weight = _em(x, mean, std, weight)
    ll2 = np.logaddexp.reduce(_gauss_loglik(x, mean, std, weight), axis=1).sum()
    # layout: mixture components (columns of the log-likelihood), not tokens
    ll1 = _gauss_loglik(x, np.array([x.mean()]), np.array([x.std()]), np.array([1.0]))[:, 0].sum()
    bic_gain = (-2 * ll1 + 2 * math.log(n)) - (-2 * ll2 + 5 * math.log(n))
    lo, up = (0, 1) if mean[0] <= mean[1] else (1, 0)
    d = math.sqrt(2) * abs(mean[up] - mean[lo]) / math.sqrt(std[lo] ** 2 + std[up] ** 2)
    ratio = 10 ** (mean[up] - mean[lo])
    present = bool(
        bic_gain > MIN_BIC_GAIN
        and d > MIN_ASHMAN_D
        and weight[up] <= MAX_UPPER_WEIGHT
        and ratio >= MIN_MODE_RATIO
    )
    threshold = _valley(mean[[lo, up]], std[[lo, up]], weight[[lo, up]]) if present else math.inf
    return _fit(
        present,
        threshold,
        float(mean[lo]),
        float(mean[up]),
        float(std[lo]),
        float(std[up]),
        float(weight[up]),
        float(d),
        float(bic_gain),
        float(ratio),
    )


def _column_sum(v: np.ndarray) -> float:
    """Left-to-right sum, the order of a column sum of a two-column array (bit for bit)."""
    return np.add.accumulate(v)[-1]


def _em(
    x: np.ndarray, mean: np.ndarray, std: np.ndarray, weight: np.ndarray, steps: int = 200
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two-Gaussian EM on one column per component (the (n, 2) layout's numbers, 6x faster)."""
    n = x.size
    root = math.sqrt(2 * math.pi)
    for _ in range(steps):
        safe = np.maximum(std, 1e-6)
        log_w, log_s = np.log(weight + 1e-300), np.log(safe * root)
        ll = []
        for k in (0, 1):
            z = (x - mean[k]) / safe[k]
            ll.append(log_w[k] - 0.5 * z * z - log_s[k])
        top = np.maximum(ll[0], ll[1])
        r0, r1 = np.exp(ll[0] - top), np.exp(ll[1] - top)
        total = r0 + r1
        resp = (r0 / total, r1 / total)
        nk = np.array([_column_sum(r) for r in resp]) + 1e-12
        new_mean = np.array([_column_sum(r * x) for r in resp]) / nk
        spread = [_column_sum(r * (x - m) ** 2) for r, m in zip(resp, new_mean, strict=True)]
        std = np.sqrt(np.array(spread) / nk) + 1e-4
        weight = nk / n
        converged = np.abs(new_mean - mean).max() < 1e-7
        mean = new_mean
        if converged:
            break
    return mean, std, weight


def _valley(mean: np.ndarray, std: np.ndarray, weight: np.ndarray) -> float:
    """Norm where the upper component's posterior first exceeds 1/2, between the two means."""
    grid = np.linspace(mean[0], mean[1], 2001)
    ll = _gauss_loglik(grid, mean, std, weight)
    # layout: mixture components (columns of the log-likelihood), not tokens
    above = np.nonzero(ll[:, 1] > ll[:, 0])[0]
    log_t = grid[above[0]] if above.size else (mean[0] + mean[1]) / 2
    return float(10**log_t)


__getattr__ = renamed(__name__, {"BimodalFit": "Bimodal"}, globals())
