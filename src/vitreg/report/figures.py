"""Report figures as PNG bytes with captions (matplotlib Agg canvases, never pyplot state).

Figures are paper-ready: PNG at DPI dots per inch (and, on request, the same figure as SVG or
PDF), cropped to their content so no label is cut, legends outside the data, plain tick labels
(no offset such as ``+1.9595e1``). Every map's colour scale runs from the CLIP_LOW-th to the CLIP_HIGH-th percentile of the values
shown (outside values are clipped), and each caption says what was measured where: residual
stream or after the final norm, head mean, native or recomputed attention.
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


def figure_formats(config: dict[str, Any] | None) -> tuple[str, ...]:
    """The vector formats a run's config asks for (its ``figure_format``), checked."""
    fmt = (config or {}).get("figure_format")
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


def map_layers(n_layers: int, emergence: int | None) -> list[int]:
    """A few layers worth showing: first, middle, emergence, the one after, last."""
    picks = {0, n_layers // 2, n_layers - 1}
    if emergence is not None:
        picks |= {emergence, min(emergence + 1, n_layers - 1)}
    return sorted(p for p in picks if 0 <= p < n_layers)


def norm_maps(norms: Any, images: np.ndarray | None) -> Figure:
    """Patch-token norm maps over the input images at a few layers and after the final norm."""
    trace, report = norms.trace, norms.report
    layers = map_layers(len(trace.sites), report.emergence_layer)
    sites = [trace.sites[i] for i in layers]
    titles = [f"block {i}" for i in layers]
    if trace.final_site:
        sites.append(trace.final_site)
        titles.append("after final norm")
    maps = [trace.patch_maps(s).numpy() for s in sites]
    shown = [len(images)] if images is not None else []
    fig = overlay_grid(maps, titles, images, "token norm")
    caption = (
        f"L2 norm of each patch token on the residual stream at blocks "
        f"{', '.join(map(str, layers))} (block outputs such as `{sites[0]}`, before the final norm)"
        + (
            ", and after the final norm (`ln_final.hook_out`, last column)"
            if trace.final_site
            else ""
        )
        + f", over the first {min(MAX_ROWS, maps[0].shape[0], *shown)} input images. "
        f"Colour: each column from its {CLIP_TEXT} (clipped)."
    )
    return figure("norm_maps", caption, fig)


def norm_quantiles(report: Any) -> Figure:
    """Per-layer patch-norm quantile curves (p1..max) on a log axis, emergence layer marked."""
    fig = new_canvas(6.5, 3.6)
    ax = fig.subplots()
    x = [lo.layer for lo in report.layers]
    for name in ("p1", "p25", "p50", "p75", "p98", "p99", "max"):
        ax.plot(x, [lo.quantiles[name] for lo in report.layers], marker=".", label=name)
    if report.final_norm is not None:
        q = report.final_norm.quantiles
        ax.scatter(
            [x[-1] + 1] * 2,
            [q["p50"], q["max"]],
            marker="x",
            color="k",
            label="after final norm (p50, max)",
        )
        ax.set_xticks(list(x[::2]) + [x[-1] + 1], [str(i) for i in x[::2]] + ["final"])
    if report.emergence_layer is not None:
        ax.axvline(report.emergence_layer, color="r", ls=":", label="emergence")
    ax.set_yscale("log")
    ax.set_xlabel("block")
    ax.set_ylabel("patch-token norm")
    outside_legend(ax)
    caption = (
        "Quantiles of patch-token norms per block on the residual stream (before the final norm); "
        "crosses: median and max after the final norm. A high max/p98 far above the median marks "
        "an outlier mode; the dotted line is the emergence block."
    )
    return figure("norm_quantiles", caption, fig)


def norm_histograms(trace: Any, report: Any, bins: int = 60) -> Figure:
    """Histograms of log10 patch-token norms, one row per layer (log counts), thresholds marked."""
    from matplotlib.colors import LogNorm

    entries = list(zip(trace.sites, report.layers, strict=True))
    if trace.final_site and report.final_norm is not None:
        entries.append((trace.final_site, report.final_norm))
    logs = [
        np.log10(np.clip(trace.patch_norms(s).numpy().ravel(), 1e-12, None)) for s, _ in entries
    ]
    lo, hi = min(v.min() for v in logs), max(v.max() for v in logs)
    edges = np.linspace(lo, hi + 1e-9, bins + 1)
    counts = np.stack([np.histogram(v, bins=edges)[0] for v in logs]).astype(float)
    fig = new_canvas(7.0, 0.28 * len(entries) + 1.4)
    ax = fig.subplots()
    masked = np.ma.masked_equal(counts, 0)
    im = ax.pcolormesh(
        edges,
        np.arange(len(entries) + 1) - 0.5,
        masked,
        cmap="Greys",
        norm=LogNorm(vmin=0.5, vmax=max(counts.max(), 1)),
    )
    for row, (_, lo_) in enumerate(entries):
        auto = lo_.thresholds.get("auto", float("inf"))
        if np.isfinite(auto):
            ax.plot([np.log10(auto)] * 2, [row - 0.45, row + 0.45], color="r", lw=1.5)
        if "top_p" in lo_.thresholds:
            ax.plot(
                [np.log10(lo_.thresholds["top_p"])] * 2,
                [row - 0.45, row + 0.45],
                color="deepskyblue",
                ls=":",
                lw=1.5,
            )
    labels = [
        ("final norm" if lo_.layer is None else f"block {lo_.layer}")
        + (" *" if lo_.present else "")
        for _, lo_ in entries
    ]
    ax.set_yticks(range(len(entries)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("log10 patch-token norm")
    fig.colorbar(im, ax=ax, label="tokens (log scale)", pad=0.02)
    fig.subplots_adjust(left=0.16, right=0.98, bottom=0.7 / (0.28 * len(entries) + 1.4), top=0.97)
    caption = (
        "Histogram of log10 patch-token norms per block (one row each; grey level = token count, "
        "log scale), residual stream, last row after the final norm. Red: the auto threshold "
        "(valley of the two-mode fit; absent when there is no outlier mode). Light-blue dotted: the "
        "top_p cut, which flags p% of tokens in every model. * marks blocks with an outlier mode."
    )
    return figure("norm_histograms", caption, fig)


def attention_maps(
    attn: Any, images: np.ndarray | None, emergence: int | None, source: str
) -> Figure:
    """Head-mean attention maps over the input images at a few layers."""
    picks = map_layers(len(attn.layer_maps), emergence)
    maps = [attn.layer_maps[i].detach().float().cpu().numpy() for i in picks]
    titles = [f"block {attn.layers[i] if attn.layers[i] is not None else i}" for i in picks]
    fig = overlay_grid(maps, titles, images, "attention")
    caption = (
        f"{_attention_what(attn)}, averaged over heads ({source} attention), over the input "
        f"images. Colour: each column from its {CLIP_TEXT} (clipped)."
    )
    return figure("attention_maps", caption, fig)


def attention_heads(attn: Any, images: np.ndarray | None, max_heads: int = 12) -> Figure:
    """Per-head attention maps of the last layer over the input images."""
    # layout: axis 1 is heads, not tokens
    heads = attn.last_layer_heads.detach().float().cpu().numpy()[:, :max_heads]
    maps = [heads[:, h] for h in range(heads.shape[1])]
    fig = overlay_grid(maps, [f"head {h}" for h in range(len(maps))], images, "attention")
    caption = (
        f"{_attention_what(attn)} per head in the last block (first {len(maps)} heads). "
        f"Colour: each column from its {CLIP_TEXT} (clipped)."
    )
    return figure("attention_heads", caption, fig)


def _attention_what(attn: Any) -> str:
    if attn.query == "cls":
        return "[CLS]→patch attention"
    return "Mean attention received by each patch (the model has no [CLS])"


def attention_agreement(attn: Any) -> Figure:
    """Precision, recall and IoU of attention-map artifacts against norm outliers per layer."""
    fig = new_canvas(6.0, 3.2)
    ax = fig.subplots()
    x = [layer if layer is not None else i for i, layer in enumerate(attn.layers)]
    for key in ("precision", "recall", "iou", "top_p_iou"):
        y = [a.get(key) if a and a.get(key) is not None else np.nan for a in attn.agreement]
        if not np.isnan(y).all():
            ax.plot(x, y, marker="o", label=key)  # NaN (0/0) leaves a gap
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("block")
    ax.set_ylabel("agreement")
    outside_legend(ax)
    caption = (
        "Agreement per block between attention-map artifact patches and the norm outliers of the "
        f"same block's output on the residual stream ({attn.norm_method} rule): precision "
        "(attention artifacts that are norm outliers), recall, IoU, and top_p_iou (top p% "
        "attention vs top p% norms)."
    )
    return figure("attention_agreement", caption, fig)


def ln_similarity(ln: Any) -> Figure:
    """Mean cosine similarity per token pair before/after norm1 and norm2, per block."""
    fig = new_canvas(9.0, 3.4)
    axes = fig.subplots(1, 2, sharey=True)
    colours = {"cls_patch": "C0", "patch_patch": "C1", "register_patch": "C2", "register_cls": "C3"}
    blocks = list(range(len(ln.similarity)))
    for ax, (pre, post, title) in zip(
        axes, (("pre_ln1", "post_ln1", "norm1"), ("pre_ln2", "post_ln2", "norm2")), strict=True
    ):
        for pair, colour in colours.items():
            for point, style in ((pre, "--"), (post, "-")):
                vals = [ln.similarity[b].get(point, {}).get(pair, {}).get("mean") for b in blocks]
                pts = [(b, v) for b, v in zip(blocks, vals, strict=True) if v is not None]
                if pts:
                    lbl = f"{pair} {'before' if style == '--' else 'after'}"
                    ax.plot(*zip(*pts, strict=True), style, color=colour, marker=".", label=lbl)
        ax.axhline(0, color="0.7", lw=0.8)
        ax.set_title(f"before (dashed) / after (solid) {title}", fontsize=9)
        ax.set_xlabel("block")
    axes[0].set_ylabel("mean cosine similarity")
    outside_legend(axes[1])
    caption = (
        "Mean cosine similarity between token types in every block, before and after the "
        "pre-attention norm (norm1, left) and the pre-MLP norm (norm2, right), averaged over images."
    )
    return figure("ln_similarity", caption, fig)


def channel_ownership(ln: Any) -> Figure:
    """Fraction of channels owned by [CLS] or patches per block, and norm1's gain on them."""
    fig = new_canvas(6.5, 3.2)
    ax = fig.subplots()
    x = list(range(len(ln.owned_fraction)))
    ax.bar(x, [v if v is not None else 0.0 for v in ln.owned_fraction], color="C0")
    ax.set_xlabel("block")
    ax.set_ylabel("owned channel fraction", color="C0")
    gains = [(b, g) for b, g in enumerate(ln.gain_on_owned) if g is not None]
    if gains:
        ax2 = ax.twinx()
        ax2.plot(*zip(*gains, strict=True), color="C3", marker="o")
        ax2.set_ylabel("norm1 |gain| owned / other", color="C3")
    caption = (
        "Channel ownership at each block's input (residual stream): share of channels with "
        "|log(E|x_cls| / E|x_patch|)| > log 4 (bars) and the mean |gain| of norm1 on owned over "
        "other channels (red)."
    )
    return figure("channel_ownership", caption, fig)


def redundancy_maps(red: Any, images: np.ndarray | None) -> Figure:
    """Local redundancy (cosine similarity to 4 neighbours) at the patch embedding and a layer."""
    maps = [
        red.embed_maps.detach().float().cpu().numpy(),
        red.layer_maps.detach().float().cpu().numpy(),
    ]
    titles = ["patch embedding", f"block {red.layer}"]
    fig = overlay_grid(maps, titles, images, "neighbour cosine")
    caption = (
        "Local redundancy: mean cosine similarity of each patch to its 4 neighbours at the patch "
        f"embedding (`hook_embed`) and at `{red.layer_site}`. Colour: each column from its "
        f"{CLIP_TEXT} (clipped)."
    )
    return figure("redundancy_maps", caption, fig)


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


def feature_pictures(pictures: Any, images: np.ndarray | None) -> Figure:
    """PCA colours and centre-patch similarity at the analysed layer and after the final norm."""
    columns = []
    for p in pictures.by_site.values():
        label = "final norm" if p.where == "after the final norm" else p.site.split(".hook")[0]
        columns.append(GridColumn(f"PCA, {label}", p.basis.rgb(p.features)))
        columns.append(similarity_column(f"similarity, {label}", p))
    first = next(iter(pictures.by_site.values()))
    caption = (
        "The patch features themselves, at "
        + " and ".join(f"`{p.site}` ({p.where})" for p in pictures.by_site.values())
        + ": the first three principal components as red, green and blue (PCA fitted on all "
        f"{first.basis.n_patches} patch tokens of the run, each component's colour from its "
        f"{CLIP_TEXT}; explained variance "
        + "; ".join(
            ", ".join(f"{100 * v:.0f}%" for v in p.basis.explained)
            for p in pictures.by_site.values()
        )
        + "), and the cosine similarity of the centre patch (green square, row "
        f"{first.query[0]}, column {first.query[1]}) to every patch of its image. Outlier tokens "
        "show up as patches of one saturated colour that the centre patch does not resemble."
    )
    return map_grid("feature_pictures", columns, images, caption)
