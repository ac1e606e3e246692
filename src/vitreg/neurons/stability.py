"""How stable the automatic path's answer is: the causal set chosen from each of two disjoint
halves of the discovery images (same detection, same held-out images), and their overlap; and
whether the set found at one resolution also cleans others.

A set that two halves of the images agree on does not hang on a few images; a low overlap says
the ranking that feeds the causal check is noisy at this image count (use more images). Register
neurons are resolution-specific in the paper's lists, so a set is checked at each other size
with the same held-out images resized.
"""

from __future__ import annotations

from typing import Any

import torch

from vitreg.fix.neuron_set import NeuronSet
from vitreg.models.model import Model
from vitreg.neurons.calibrate import calibrate_top_k
from vitreg.neurons.discover import discover
from vitreg.neurons.held_out import HeldOutSplit, causal_set
from vitreg.results.neurons import DetectionRecord, OtherSizes, SizeCheck, Stability
from vitreg.settings.neurons import NeuronSearch


def overlap(a: set, b: set) -> float:
    """Jaccard overlap of two sets (1.0 for two empty sets)."""
    return len(a & b) / len(a | b) if a | b else 1.0


def half_sets(
    model: Model,
    discovery: Any,
    held: torch.Tensor,
    detection: DetectionRecord,
    chosen: list[tuple[int, int]],
    search: NeuronSearch,
    *,
    batch_size: int = 32,
) -> Stability:
    """The causal sets of the two halves of ``discovery`` (each ranked as ``search`` says,
    checked on ``held``) against each other and against ``chosen`` (the set from all of them)."""
    sets = []
    for parity in (0, 1):
        ranking = discover(
            model,
            HeldOutSplit(discovery, held_out=bool(parity), period=2),
            search,
            detection=detection,
            batch_size=batch_size,
        )
        picked = causal_set(model, held, ranking, detection, batch_size)
        sets.append(set(picked.units()))
    a, b, whole = *sets, set(chosen)
    return Stability(
        method="the causal set chosen from each half of the discovery images (every other "
        "image), with the same detection and held-out images",
        halves=[sorted([list(u) for u in s]) for s in sets],
        overlap_between_halves=overlap(a, b),
        overlap_with_whole=[overlap(a, whole), overlap(b, whole)],
    )


def other_sizes(
    model: Model,
    chosen: NeuronSet,
    held: torch.Tensor,
    sizes: list[int],
    search: NeuronSearch,
    *,
    tolerance: float,
    batch_size: int = 32,
) -> OtherSizes:
    """The fix of ``chosen`` checked on ``held`` resized to each of ``sizes`` (every block, as
    on the native size, against ``search.target``): before and after, and whether it is clean
    at every size."""
    _, curve = calibrate_top_k(
        model,
        chosen,
        held,
        search,
        tolerance=tolerance,
        ks=(0, len(chosen)),
        image_sizes=sizes,
        batch_size=batch_size,
        keep_all=True,
    )
    rows = [
        SizeCheck(
            img_size=size,
            blocks_with_outlier_mode_before=before.blocks_with_mode,
            blocks_with_outlier_mode_after=after.blocks_with_mode,
            max_over_median_before=before.max_over_median,
            max_over_median_after=after.max_over_median,
            ordinary_max_over_median=before.ordinary_max_over_median,
            outlier_rate_before=before.outlier_rate,
            outlier_rate_after=after.outlier_rate,
            clean_after=after.clean,
        )
        for size, (before, after) in zip(sizes, curve.checks.values(), strict=True)
    ]
    return OtherSizes(
        method=f"the chosen set's fix on the {len(held)} held-out images resized (bicubic) to "
        "each size, checked at every block as at the native size",
        sizes=rows,
        clean_at_every_size=all(r.clean_after for r in rows),
    )
