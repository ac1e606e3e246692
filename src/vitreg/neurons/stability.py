"""How stable the automatic path's answer is: the causal set chosen from each of two disjoint
halves of the discovery images (same detection, same held-out images), and their overlap.

A set that two halves of the images agree on does not hang on a few images; a low overlap says
the ranking that feeds the causal check is noisy at this image count (use more images).
"""

from __future__ import annotations

from typing import Any

import torch

from vitreg.models.model import Model
from vitreg.neurons.auto import Split, causal_set
from vitreg.neurons.discover import discover


def overlap(a: set, b: set) -> float:
    """Jaccard overlap of two sets (1.0 for two empty sets)."""
    return len(a & b) / len(a | b) if a | b else 1.0


def half_sets(
    model: Model,
    discovery: Any,
    held: torch.Tensor,
    detection: Any,
    chosen: list[tuple[int, int]],
    *,
    top_k: int,
    batch_size: int = 32,
) -> dict[str, Any]:
    """The causal sets of the two halves of ``discovery`` (checked on ``held``) against each
    other and against ``chosen`` (the set from all of them)."""
    sets = []
    for parity in (0, 1):
        ranking = discover(
            model,
            Split(discovery, held_out=bool(parity), period=2),
            top_k=top_k,
            batch_size=batch_size,
            detection=detection,
        )
        picked = causal_set(model, held, ranking, detection, batch_size)
        sets.append(set(picked.chosen))
    a, b, whole = *sets, set(chosen)
    return {
        "method": "the causal set chosen from each half of the discovery images (every other "
        "image), with the same detection and held-out images",
        "halves": [sorted([list(u) for u in s]) for s in sets],
        "overlap_between_halves": overlap(a, b),
        "overlap_with_whole": [overlap(a, whole), overlap(b, whole)],
    }
