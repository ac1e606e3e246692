"""The verdict of one mean against another from their 95% intervals over seeds."""

from __future__ import annotations

import math


def interval_verdict(
    base: tuple[float, float | None], other: tuple[float, float | None], higher_is_better: bool
) -> str:
    """ "better"/"worse" for ``other`` against ``base`` (each ``(mean, 95% half-width)``) only
    when the two intervals do not overlap; "within noise" when they do; "no interval" when a
    half-width is missing (one seed) and nothing can be said."""
    (m0, c0), (m1, c1) = base, other
    if c0 is None or c1 is None or not (math.isfinite(c0) and math.isfinite(c1)):
        return "no interval"
    if m1 - c1 > m0 + c0:
        return "better" if higher_is_better else "worse"
    if m1 + c1 < m0 - c0:
        return "worse" if higher_is_better else "better"
    return "within noise"
