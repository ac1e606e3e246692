"""The labels of every exported token: its kind, grid cell, norms and the flags diagnose's
rules give it (outlier by the run's fitted bimodal cut, sink key by each head's sink event)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vitreg.analysis.anomaly_lof import MIN_TOKENS, lof_flags
from vitreg.analysis.sink_rules import dominant_keys
from vitreg.core.layout import TokenLayout
from vitreg.export.sites import KIND_CODES


def sink_counts(pattern: torch.Tensor) -> torch.Tensor:
    """``[B, N]``: how many heads have a sink event (diagnose's rule: at least 90% of queries put
    >= 0.5 on the dominant key) landing on each key token, from ``pattern [B, H, N, N]``."""
    dom = dominant_keys(pattern)
    counts = torch.zeros(pattern.shape[0], pattern.shape[-1], dtype=torch.int16)
    return counts.scatter_add_(1, dom.key.cpu(), dom.event.to(torch.int16).cpu())


@dataclass(frozen=True)
class Positions:
    """The token positions exported (those of the chosen kinds), with their kind codes and grid
    cells (-1 off the grid)."""

    index: torch.Tensor  # [P] positions in the sequence
    kind: torch.Tensor  # [P] int8 codes into KIND_CODES
    row: torch.Tensor  # [P] int16
    col: torch.Tensor  # [P] int16
    patch: torch.Tensor  # [P] bool

    @classmethod
    def of(cls, layout: TokenLayout, kinds: list[str]) -> Positions:
        types = layout.token_types()
        index = [i for i, t in enumerate(types) if t in kinds]
        w = layout.grid[1]
        start = layout.patches.start
        cells = [(i - start) if types[i] == "patch" else -1 for i in index]
        return cls(
            torch.tensor(index, dtype=torch.long),
            torch.tensor([KIND_CODES.index(types[i]) for i in index], dtype=torch.int8),
            torch.tensor([c // w if c >= 0 else -1 for c in cells], dtype=torch.int16),
            torch.tensor([c % w if c >= 0 else -1 for c in cells], dtype=torch.int16),
            torch.tensor([c >= 0 for c in cells], dtype=torch.bool),
        )


@dataclass
class LayerBatch:
    """One layer of one batch, at the exported positions: activations ``[B, P, D]``, their
    norms, the rule site's norms, outlier and sink flags (each ``[B, P]``)."""

    acts: torch.Tensor
    norm: torch.Tensor
    rule_norm: torch.Tensor
    outlier: torch.Tensor
    sink_heads: torch.Tensor
    lof: torch.Tensor | None = None  # bool, with --lof
    lof_score: torch.Tensor | None = None  # float32, NaN off the grid

    def keep(self, exclude: list[str]) -> torch.Tensor:
        """``[B, P]`` bool: the tokens no ``--exclude`` rule drops."""
        dropped = torch.zeros_like(self.outlier)
        if "outliers" in exclude:
            dropped |= self.outlier
        if "sinks" in exclude:
            dropped |= self.sink_heads > 0
        return ~dropped


def lof_labels(
    acts: torch.Tensor, layout: TokenLayout, positions: Positions
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(flagged [B, P] bool, score [B, P] float32)`` at the exported positions: diagnose's LOF
    rule (SC-CLIP's LocalOutlierFactor) fitted per image on all its patch tokens of ``acts
    [B, N, D]``; tokens off the grid, and images with too few patches, are not flagged (NaN)."""
    batch, n = acts.shape[0], positions.index.numel()
    flagged = torch.zeros(batch, n, dtype=torch.bool)
    score = torch.full((batch, n), math.nan)
    patches = layout.take(acts, "patches").float()
    on_grid = positions.patch
    if not on_grid.any() or patches.shape[1] < MIN_TOKENS:
        return flagged, score
    cell = (positions.row.long() * layout.grid[1] + positions.col.long())[on_grid]
    for b in range(batch):
        f, s = lof_flags(patches[b].numpy())
        flagged[b, on_grid] = torch.from_numpy(f)[cell]
        score[b, on_grid] = torch.from_numpy(s).float()[cell]
    return flagged, score


def outlier_flags(rule: torch.Tensor, positions: Positions, cut: float | None) -> torch.Tensor:
    """``[B, P]`` bool: the patch tokens whose rule-site norm ``rule`` is above the ``cut``
    (none without a bimodal cut)."""
    return positions.patch[None, :] & (rule > (math.inf if cut is None else cut))


def label_layer(
    acts: torch.Tensor,
    rule_norms: torch.Tensor,
    pattern_counts: torch.Tensor | None,
    positions: Positions,
    cut: float | None,
    dtype: torch.dtype = torch.float32,
) -> LayerBatch:
    """The labels of one layer: ``acts [B, N, D]`` at the site, ``rule_norms [B, N]`` at the
    rule site, sink-head counts ``[B, N]`` (``None``: no heads after the layer, zeros); the
    activations are kept in ``dtype``, their norms taken before."""
    at = positions.index
    taken = acts[:, at]
    norm = taken.float().norm(dim=-1)
    rule = rule_norms[:, at]
    outlier = outlier_flags(rule, positions, cut)
    sinks = (
        pattern_counts[:, at]
        if pattern_counts is not None
        else torch.zeros(rule.shape, dtype=torch.int16)
    )
    return LayerBatch(taken.to(dtype), norm, rule, outlier, sinks)
