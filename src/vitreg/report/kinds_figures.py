"""Figures of the issue-20 analyses: where sinks land on the patch grid, and which positions
are outliers across images beside the position embedding's norm."""

from __future__ import annotations

from typing import Any

import numpy as np

from vitreg.report.figures import Figure, figure, new_canvas


def _panel(fig: Any, ax: Any, values: Any, title: str, label: str) -> None:
    im = ax.imshow(np.asarray(values, dtype=float), cmap="magma", interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label=label)


def sink_map(sinks: Any) -> Figure:
    """Sink events per image whose dominant key is each patch position (all blocks, heads)."""
    fig = new_canvas(3.6, 3.2)
    ax = fig.subplots()
    _panel(fig, ax, sinks.patch_map, "sink keys on patches", "events per image")
    caption = (
        "Sink positions: for each patch, the sink events per image (summed over blocks and "
        "heads) whose dominant key is that patch; [CLS] and register sinks are counted in the "
        "Attention sinks section."
    )
    return figure("sink_map", caption, fig)


def position_maps(pos: Any) -> Figure:
    """Per-position outlier rate across images, and the position embedding's norm."""
    panels = [(pos.rate_map, f"outlier rate (block {pos.block})", "share of images")]
    if pos.pos_embed is not None:
        panels.append((pos.pos_embed["norm_map"], "position embedding", "norm"))
    fig = new_canvas(3.4 * len(panels), 3.2)
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (values, title, label) in zip(axes, panels, strict=True):
        _panel(fig, ax, values, title, label)
    caption = (
        "Position-tied artifacts: share of images in which each patch position is an auto norm "
        "outlier (position-consistency score "
        f"{pos.score:.2f})"
        + (", and the learned position embedding's norm" if len(panels) > 1 else "")
        + "."
    )
    return figure("position_maps", caption, fig)


def kinds_figures(results: dict[str, Any]) -> list[Figure]:
    """The figures the sink and position results support."""
    figs = []
    if results.get("sinks") is not None:
        figs.append(sink_map(results["sinks"]))
    if results.get("positions") is not None:
        figs.append(position_maps(results["positions"]))
    return figs
