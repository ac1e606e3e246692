"""Reading an attention pattern: each pattern site says how its probabilities become per-patch maps.

A global site (``[B, H, N, N]``) reads the [CLS] row restricted to patch columns, or without [CLS]
the mean attention each patch receives; sites with other geometry (Swin windows, PVT-v2 reduced
keys) override :meth:`~vitreg.hooks.attention.PatternSite.reading` next to the adapter that knows
that geometry, so analyses read every pattern the same way and never import an adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from vitreg.core.layout import TokenLayout
from vitreg.hooks.streamed import StreamedPattern, column_mean, query_rows

Grid = tuple[int, int]
_ALL_KEYS = "every token (prefix included)"


@dataclass
class PatternRead:
    """One batch of a pattern site, reduced: per-head maps and the rows sink statistics use."""

    heads: torch.Tensor  # [B, H, h, w] per-head map
    rows: torch.Tensor | StreamedPattern  # [B, ..., K] attention rows (probabilities over K keys)
    weights: torch.Tensor | None = None  # weights of rows.shape[1:-1] (None: all equal)
    token_grid: Grid | None = None  # grid of the tokens the map positions are (None: not tokens)


Reader = Callable[[torch.Tensor | StreamedPattern, TokenLayout], PatternRead]


@dataclass(frozen=True)
class PatternReading:
    """How one pattern site is read: the reader, which queries it uses, and both in words."""

    read: Reader
    query: str  # "cls" (the [CLS] row) or "mean_received" (every query, averaged)
    how: str  # what the map is
    keys: str  # which keys a row spans


def read_global(
    p: torch.Tensor | StreamedPattern, layout: TokenLayout, query: str = "cls"
) -> PatternRead:
    """Global attention ``[B, H, N, N]``: [CLS] row (``query='cls'``) or mean received attention.

    A streamed pattern gives the [CLS] rows alone, or itself as ``rows`` with the mean
    received attention from its column sums."""
    layout.check(p, dim=-1)
    b, h = p.shape[:2]
    if query == "cls":
        rows = query_rows(p, layout.cls)  # [B, H, 1, N]
        per_head = rows.mean(2)
    else:
        rows = p
        per_head = column_mean(p)
    heads = layout.take(per_head, "patches", dim=-1).reshape(b, h, *layout.grid)
    return PatternRead(heads, rows, None, layout.grid)


def global_reading(layout: TokenLayout) -> PatternReading:
    """The [CLS] row when the model has a [CLS], else the mean attention each patch receives."""
    if layout.n_cls:
        how = "[CLS] row restricted to patch columns"
        return PatternReading(partial(read_global, query="cls"), "cls", how, _ALL_KEYS)
    how = "mean over all queries of the attention each patch receives"
    reader = partial(read_global, query="mean_received")
    return PatternReading(reader, "mean_received", how, _ALL_KEYS)
