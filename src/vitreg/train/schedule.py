"""Step schedules: linear warmup + cosine learning rate, cosine EMA momentum, linear warmups."""

from __future__ import annotations

import math


def cosine(step: int, total: int, start: float, end: float) -> float:
    """Cosine interpolation from ``start`` (step 0) to ``end`` (step ``total``)."""
    t = min(max(step, 0), total) / max(total, 1)
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * t))


def warmup_cosine(step: int, total: int, peak: float, warmup: int, final: float) -> float:
    """Learning rate at 0-based ``step``: linear up to ``peak`` over ``warmup`` steps, then cosine."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return cosine(step - warmup, max(total - warmup, 1), peak, final)


def linear_warmup(step: int, warmup: int, start: float, end: float) -> float:
    """``start`` rising linearly to ``end`` over ``warmup`` steps, then ``end``."""
    if step >= warmup:
        return end
    return start + (end - start) * step / warmup
