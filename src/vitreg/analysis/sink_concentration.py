"""The sink concentration ratio of each block and head (owenzlz 2026, "Anatomy of Attention Sinks
in ViTs"): with the column sums ``c_j = sum_i A_ij`` of one image's pattern,
``r = max_j c_j / median_j c_j`` (the median of an even count is the mean of the middle two).
``r >= 1``; a head whose queries spread evenly has ``r`` near 1, a head that piles its attention
onto one key has ``r`` in the tens or more. The column means the sink rules already take give
the same ratio, so it costs one sort of ``N`` numbers per image and head.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vitreg.errors import InputError
from vitreg.results.sink_measures import SinkConcentration

RULE = (
    "r = max_j c_j / median_j c_j of the column sums c_j = sum_i A_ij over all queries i, per "
    "image, block and head; the mean over images is shown (owenzlz 2026, Anatomy of Attention "
    "Sinks in ViTs)"
)


def concentration_ratio(columns: torch.Tensor) -> torch.Tensor:
    """``max / median`` over the last dimension of column sums (or means) ``[..., N]``."""
    c = columns.float().sort(dim=-1).values
    n = c.shape[-1]
    median = (c[..., (n - 1) // 2] + c[..., n // 2]) / 2
    return c[..., -1] / median.clamp_min(torch.finfo(torch.float32).tiny)


def summarise_concentration(
    blocks: Sequence[int], per_block: Sequence[torch.Tensor]
) -> SinkConcentration:
    """The mean and largest ratio per head of each block from its ``[n_images, H]`` ratios."""
    if not per_block:
        raise InputError("no block reached: the concentration ratio needs at least one pattern")
    mean = [r.double().mean(0).tolist() for r in per_block]
    top = [r.double().max(0).values.tolist() for r in per_block]
    peak, where = max(
        (v, (b, h)) for b, row in zip(blocks, mean, strict=True) for h, v in enumerate(row)
    )
    return SinkConcentration(
        rule=RULE,
        blocks=list(blocks),
        mean=mean,
        max=top,
        peak_block=where[0],
        peak_head=where[1],
        peak=peak,
    )


def concentrated_heads(conc: SinkConcentration, min_ratio: float) -> list[tuple[int, int, float]]:
    """``(block, head, mean r)`` of every head whose mean ratio is at least ``min_ratio``,
    largest first (``min_ratio`` must be a finite number >= 1: r is never below 1)."""
    if not (math.isfinite(min_ratio) and min_ratio >= 1.0):
        raise InputError(
            f"a concentration threshold must be a finite number >= 1 (max over median is never "
            f"below 1), got {min_ratio!r}"
        )
    found = [
        (b, h, v)
        for b, row in zip(conc.blocks, conc.mean, strict=True)
        for h, v in enumerate(row)
        if v >= min_ratio
    ]
    return sorted(found, key=lambda x: -x[2])
