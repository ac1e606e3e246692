"""The presence test's EM gives the numbers of the textbook two-column EM, bit for bit."""

import math

import numpy as np
import pytest

from vitreg.analysis.thresholds import _em


def _two_column_em(x, mean, std, weight, steps=200):
    """EM with the responsibilities as one (tokens, 2) array: the layout the fit was defined in."""
    n = x.size
    for _ in range(steps):
        safe = np.maximum(std, 1e-6)
        z = (x[:, None] - mean[None]) / safe[None]
        log_w = np.log(weight[None] + 1e-300)
        ll = log_w - 0.5 * z * z - np.log(safe[None] * math.sqrt(2 * math.pi))
        resp = np.exp(ll - ll.max(1, keepdims=True))
        resp /= resp.sum(1, keepdims=True)
        nk = resp.sum(0) + 1e-12
        new_mean = (resp * x[:, None]).sum(0) / nk
        std = np.sqrt((resp * (x[:, None] - new_mean) ** 2).sum(0) / nk) + 1e-4
        weight = nk / n
        converged = np.abs(new_mean - mean).max() < 1e-7
        mean = new_mean
        if converged:
            break
    return mean, std, weight


def _sample(kind: int, rng: np.random.Generator) -> np.ndarray:
    n = int(rng.integers(50, 6000))
    if kind == 0:  # one mode
        return rng.lognormal(0, rng.uniform(0.05, 1.0), n)
    if kind == 1:  # a minority mode of outliers
        k = max(1, int(n * rng.uniform(0.002, 0.3)))
        bulk = rng.lognormal(0, 0.2, n - k)
        return np.r_[bulk, rng.lognormal(rng.uniform(0.3, 3), 0.2, k)]
    if kind == 2:  # skewed
        return rng.gamma(rng.uniform(0.5, 5), 1, n)
    return np.round(rng.lognormal(0, 0.5, n), 1) + 1e-3  # ties


@pytest.mark.parametrize("kind", range(4))
def test_em_matches_the_two_column_layout_bit_for_bit(kind):
    rng = np.random.default_rng(kind)
    for _ in range(6):
        x = np.log10(_sample(kind, rng).astype(np.float32).astype(np.float64))
        cut = np.quantile(x, rng.uniform(0.6, 0.95))
        hi = x > cut
        if hi.all() or not hi.any():
            continue
        start = (
            np.array([x[~hi].mean(), x[hi].mean()]),
            np.array([x[~hi].std() + 1e-3, x[hi].std() + 1e-3]),
            np.array([1 - hi.mean(), hi.mean()]),
        )
        got = _em(x, *start)
        want = _two_column_em(x, *start)
        for g, w in zip(got, want, strict=True):
            assert g.tobytes() == w.tobytes()
