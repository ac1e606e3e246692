"""Figures as PNG bytes with captions (matplotlib Agg canvases, never pyplot state): the
plotting every verb's figures share.

Figures are paper-ready: PNG at DPI dots per inch (and, on request, the same figure as SVG or
PDF), cropped to their content so no label is cut, legends outside the data, plain tick labels
(no offset such as ``+1.9595e1``). Every map's colour scale runs from the CLIP_LOW-th to the
CLIP_HIGH-th percentile of the values shown (outside values are clipped); map grids put the
input images under their maps.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitreg.core.io import write_bytes_atomic

CLIP_LOW, CLIP_HIGH = 1.0, 99.0
CMAP = "inferno"
CLIP_TEXT = f"{CLIP_LOW:g}st to {CLIP_HIGH:g}th percentile"
MAX_ROWS = 4
DPI = 200
TICK_SIZE = 8
PAD_INCHES = 0.05
PNG_COMPRESSION = 1  # zlib level of figures/*.png: level 6 took a quarter of a report's time
MIN_SPAN = 0.02  # of the values' size: the narrowest y range a line plot is drawn with
VECTOR_FORMATS = ("svg", "pdf")


@dataclass
class Figure:
    """One rendered figure: file stem, caption saying what and where, PNG bytes, and the
    matplotlib figure (``source``) that vector copies are rendered from."""

    name: str
    caption: str
    png: bytes
    source: Any = field(default=None, repr=False, compare=False)

    @property
    def filename(self) -> str:
        return f"{self.name}.png"

    def save(self, folder: str | Path, formats: Sequence[str] = ()) -> list[Path]:
        """Write ``folder/<name>.png`` and one ``<name>.<fmt>`` per vector format, atomically."""
        paths = [write_bytes_atomic(Path(folder) / self.filename, self.png)]
        for fmt in formats:
            if self.source is None:
                raise ValueError(
                    f"figure {self.name!r} keeps no matplotlib figure to save as {fmt}"
                )
            paths.append(
                write_bytes_atomic(Path(folder) / f"{self.name}.{fmt}", encode(self.source, fmt))
            )
        return paths


def figure_formats(fmt: str | None) -> tuple[str, ...]:
    """The vector formats a run's config asks for (its ``figure_format``: None for PNG only),
    checked."""
    if fmt is None:
        return ()
    if fmt not in VECTOR_FORMATS:
        raise ValueError(f"figure_format must be one of {', '.join(VECTOR_FORMATS)}, got {fmt!r}")
    return (fmt,)


def figure(name: str, caption: str, fig: Any) -> Figure:
    """A :class:`Figure` from a matplotlib figure (PNG now, vector formats when saved)."""
    return Figure(name, caption, png_bytes(fig), fig)


def new_canvas(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.1, right=0.88, bottom=0.15, top=0.9)
    return fig


def outside_legend(ax: Any, **kwargs: Any) -> Any:
    """The legend to the right of ``ax``, outside the data (the saved figure grows to hold it)."""
    return ax.legend(
        loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=8, **kwargs
    )


def all_axes(fig: Any) -> list[Any]:
    """Every axes of ``fig``, inset axes (the maps' colour bars) included."""
    found, todo = [], list(fig.axes)
    while todo:
        ax = todo.pop(0)
        found.append(ax)
        todo += [c for c in ax.child_axes if c not in found]
    return found


def tidy(fig: Any) -> None:
    """Readable ticks everywhere (colour bars too) and plain numbers: no offset text; a
    one-point line gets a marker (a model with one block still shows its value); a plot
    or scatter plot whose values barely vary gets a y range of at least MIN_SPAN of their
    size, so its tick labels stay short (0.1997 to 0.2003, not 0.199702 to 0.199714)."""
    from matplotlib.collections import PathCollection
    from matplotlib.ticker import ScalarFormatter

    for ax in all_axes(fig):
        ax.tick_params(which="both", labelsize=TICK_SIZE)
        for line in ax.get_lines():
            if len(line.get_xdata()) == 1 and line.get_marker() in ("None", "", " ", None):
                line.set_marker("o")  # one block: a line with no marker would draw nothing
        points = ax.get_lines() or any(isinstance(c, PathCollection) for c in ax.collections)
        if points and ax.get_yscale() == "linear":
            widen(ax)
        for axis in (ax.xaxis, ax.yaxis):
            fmt = axis.get_major_formatter()
            if isinstance(fmt, ScalarFormatter):
                fmt.set_useOffset(False)
                fmt.set_scientific(False)
            elif axis.get_scale() == "log":
                axis.set_major_formatter(_plain_log()())
                axis.set_minor_formatter(_plain_log()(labelOnlyBase=False))


def widen(ax: Any) -> None:
    """``ax``'s y range widened around its centre to at least ``MIN_SPAN`` x its largest
    |limit| when the data span less."""
    lo, hi = ax.get_ylim()
    need = MIN_SPAN * max(abs(lo), abs(hi))
    if hi - lo < need:
        mid = (lo + hi) / 2
        ax.set_ylim(mid - need / 2, mid + need / 2)


def _plain_log() -> type:
    """matplotlib's log-axis labelling (which ticks get a label) with plain numbers: 40, 0.002,
    not 4 x 10^1."""
    from matplotlib.ticker import LogFormatter

    class PlainLog(LogFormatter):
        def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
            return f"{x:g}"

    return PlainLog


def encode(fig: Any, fmt: str) -> bytes:
    """``fig`` as ``fmt`` bytes (png at DPI, svg, pdf), cropped to its content (no cut labels)."""
    tidy(fig)
    buf = io.BytesIO()
    extra = {"pil_kwargs": {"compress_level": PNG_COMPRESSION}} if fmt == "png" else {}
    # the tight box measured once here: savefig's "tight" draws the whole figure twice
    box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(PAD_INCHES)
    fig.savefig(buf, format=fmt, dpi=DPI, bbox_inches=box, **extra)
    return buf.getvalue()


def png_bytes(fig: Any) -> bytes:
    return encode(fig, "png")


def display_images(
    images: torch.Tensor | None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> np.ndarray | None:
    """``[n, H, W, 3]`` floats in [0, 1]: de-normalised with ``mean``/``std`` when given.

    Without mean/std, images already in [0, 1] are shown as they are and others are rescaled
    per image to their own range.
    """
    if images is None or not len(images):
        return None
    x = images.detach().float().cpu()
    if mean is not None and std is not None:
        x = x * torch.tensor(std).view(1, -1, 1, 1) + torch.tensor(mean).view(1, -1, 1, 1)
    elif x.min() < 0 or x.max() > 1:
        lo = x.amin(dim=(1, 2, 3), keepdim=True)
        hi = x.amax(dim=(1, 2, 3), keepdim=True)
        x = (x - lo) / (hi - lo).clamp_min(1e-12)
    return x.clamp(0, 1).permute(0, 2, 3, 1).numpy()


def clip_range(values: np.ndarray | torch.Tensor) -> tuple[float, float]:
    """The colour range: CLIP_LOW-th to CLIP_HIGH-th percentile of ``values``."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if not v.size:
        return 0.0, 1.0
    lo, hi = np.percentile(v, [CLIP_LOW, CLIP_HIGH])
    return float(lo), float(hi if hi > lo else lo + 1e-6)


def colormap_lut(name: str = CMAP) -> np.ndarray:
    """``[256, 3]`` uint8 RGB table of a matplotlib colormap (for the HTML canvas)."""
    from matplotlib import colormaps

    return (colormaps[name](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)


def overlay_grid(
    maps: list[np.ndarray],
    titles: list[str],
    images: np.ndarray | None,
    label: str,
) -> Any:
    """Rows = images, columns = ``maps`` (each ``[n, h, w]``, own clipped colour scale)."""
    from matplotlib.ticker import MaxNLocator

    counts = [m.shape[0] for m in maps] + ([len(images)] if images is not None else [])
    n = min(MAX_ROWS, *counts)
    cols = len(maps)
    fig = new_canvas(1.8 * cols, 1.8 * n + 0.9)
    axes = fig.subplots(n, cols, squeeze=False)
    fig.subplots_adjust(
        left=0.02,
        right=0.98,
        top=1 - 0.3 / (1.8 * n + 0.9),
        bottom=0.75 / (1.8 * n + 0.9),
        wspace=0.08,
        hspace=0.05,
    )
    for c, (m, title) in enumerate(zip(maps, titles, strict=True)):
        lo, hi = clip_range(m)
        for r in range(n):
            ax = axes[r][c]
            ax.set_axis_off()
            extent = (0, m.shape[2], m.shape[1], 0)
            if images is not None:
                ax.imshow(images[r], extent=extent)
            im = ax.imshow(
                m[r],
                cmap=CMAP,
                vmin=lo,
                vmax=hi,
                extent=extent,
                alpha=0.65 if images is not None else 1.0,
                interpolation="nearest",
            )
            if r == 0:
                ax.set_title(title, fontsize=9)
        cax = axes[n - 1][c].inset_axes((0.05, -0.16, 0.9, 0.07))
        bar = fig.colorbar(im, cax=cax, orientation="horizontal")
        bar.ax.xaxis.set_major_locator(MaxNLocator(3))
    fig.text(0.5, 0.01, label + " (colour scale under each column)", ha="center", fontsize=8)
    return fig


@dataclass
class GridColumn:
    """One column of :func:`map_grid`: ``[n, h, w, 3]`` RGB maps drawn as they are, or
    ``[n, h, w]`` scalar maps in ``cmap`` over ``(vmin, vmax)`` with a colour bar under the
    column; ``query`` (row, column) marks one patch."""

    title: str
    maps: np.ndarray
    cmap: str = "inferno"
    vmin: float | None = None
    vmax: float | None = None
    query: tuple[int, int] | None = None


def map_grid(
    name: str,
    columns: list[GridColumn],
    images: np.ndarray | None,
    caption: str,
    cell: float = 1.8,
) -> Figure:
    """Rows = the first images (at most MAX_ROWS); the image itself first when given, then one
    map per column; ``{n}`` in ``caption`` becomes the number of rows."""
    from matplotlib.ticker import MaxNLocator

    n = min(
        MAX_ROWS, *(len(c.maps) for c in columns), *([len(images)] if images is not None else [])
    )
    cols = len(columns) + (images is not None)
    fig = new_canvas(cell * cols, cell * n + 0.7)
    axes = fig.subplots(n, cols, squeeze=False)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.92, bottom=0.11, wspace=0.06, hspace=0.06)
    for r in range(n):
        row = list(axes[r])
        if images is not None:
            ax = row.pop(0)
            ax.imshow(images[r])
            ax.set_axis_off()
            if r == 0:
                ax.set_title("image", fontsize=9)
        for ax, c in zip(row, columns, strict=True):
            ax.set_axis_off()
            if r == 0:
                ax.set_title(c.title, fontsize=9)
            if c.maps.ndim == 4:
                ax.imshow(c.maps[r], interpolation="nearest")
                continue
            im = ax.imshow(
                c.maps[r], cmap=c.cmap, vmin=c.vmin, vmax=c.vmax, interpolation="nearest"
            )
            if c.query is not None:
                ax.plot(c.query[1], c.query[0], marker="s", ms=5, mfc="none", mec="lime", mew=1.5)
            if r == n - 1:
                cax = ax.inset_axes((0.05, -0.16, 0.9, 0.07))
                bar = fig.colorbar(im, cax=cax, orientation="horizontal")
                bar.ax.xaxis.set_major_locator(MaxNLocator(3))
    return figure(name, caption.replace("{n}", str(n)), fig)


def similarity_column(title: str, pictures: Any) -> GridColumn:
    """The cosine similarity of the query patch of ``pictures`` (one site's feature pictures)
    to every patch, on the fixed -1..1 scale."""
    maps = pictures.similarity.numpy()
    return GridColumn(title, maps, cmap="RdBu_r", vmin=-1, vmax=1, query=pictures.query)
