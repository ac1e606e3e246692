"""Step schedules: linear warmup + cosine learning rate, cosine EMA momentum, linear warmups.

:func:`warmup_cosine` is the one learning-rate schedule of vitreg: the training loop uses it for
the optimiser's lr and the linear probe (:mod:`vitreg.probe.linear`) for the factor applied to its
batched grid of learning rates (``peak=1``). timm's ``CosineLRScheduler`` is not used because its
warmup differs: it gives ``peak * t / warmup`` at step ``t`` and reaches ``peak`` only when the
cosine starts, where this warmup gives ``peak * (t + 1) / warmup`` (``peak`` already at its last
step, then again at the cosine's first). Switching would move every learning rate by one step.
"""

from __future__ import annotations

import math


def cosine(step: int, total: int, start: float, end: float) -> float:
    """Cosine interpolation from ``start`` (step 0) to ``end`` (step ``total``)."""
    t = min(max(step, 0), total) / max(total, 1)
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * t))


def warmup_cosine(step: int, total: int, peak: float, warmup: int, final: float) -> float:
    """Value at 0-based ``step`` of ``total``: linear up to ``peak`` over ``warmup`` steps (``peak``
    at step ``warmup - 1``), then cosine from ``peak`` (step ``warmup``) to ``final`` (step
    ``total``). ``final == peak`` holds ``peak`` after the warmup."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return cosine(step - warmup, max(total - warmup, 1), peak, final)


def linear_warmup(step: int, warmup: int, start: float, end: float) -> float:
    """``start`` rising linearly to ``end`` over ``warmup`` steps, then ``end``."""
    if step >= warmup:
        return end
    return start + (end - start) * step / warmup
