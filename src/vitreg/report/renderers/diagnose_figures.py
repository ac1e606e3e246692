"""The figures of a ``vitreg diagnose`` run, drawn from its analysis results: norm maps,
quantiles and histograms, attention maps, heads and agreement, redundancy maps, LayerNorm
similarity and channel ownership, feature pictures, where sinks land and which positions are
outliers; and the maps report.html's block slider draws. Each caption says what was measured
where: residual stream or after the final norm, head mean, native or recomputed attention."""

from __future__ import annotations

from typing import Any

import numpy as np

from vitreg.analysis.attention import AttentionResult
from vitreg.analysis.diagnose import DiagnoseResult
from vitreg.analysis.feature_pictures import FeaturePicturesResult
from vitreg.analysis.norms import NormsResult
from vitreg.analysis.redundancy import RedundancyResult
from vitreg.report.render.images import image_uri
from vitreg.report.render.plots import (
    CLIP_TEXT,
    MAX_ROWS,
    Figure,
    GridColumn,
    clip_range,
    colormap_lut,
    figure,
    map_grid,
    new_canvas,
    outside_legend,
    overlay_grid,
    similarity_column,
)
from vitreg.report.slider import Slider
from vitreg.results.diagnose import Attention, DiagnoseResults, LNSeparation, Norms
from vitreg.results.kinds import Positions, Sinks
from vitreg.results.sink_measures import SinkConcentration

SLIDER_IMAGES = 4


def map_layers(n_layers: int, emergence: int | None) -> list[int]:
    """A few layers worth showing: first, middle, emergence, the one after, last."""
    picks = {0, n_layers // 2, n_layers - 1}
    if emergence is not None:
        picks |= {emergence, min(emergence + 1, n_layers - 1)}
    return sorted(p for p in picks if 0 <= p < n_layers)


def norm_maps(norms: NormsResult, images: np.ndarray | None) -> Figure:
    """Patch-token norm maps over the input images at a few layers and after the final norm."""
    trace = norms.trace
    layers = map_layers(len(trace.sites), norms.summary.emergence_layer)
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


def norm_quantiles(report: Norms) -> Figure:
    """Per-layer patch-norm quantile curves (p1..max) on a log axis, emergence layer marked."""
    fig = new_canvas(6.5, 3.6)
    ax = fig.subplots()
    x = [lo.layer for lo in report.layers]
    for name in ("p1", "p25", "p50", "p75", "p98", "p99", "max"):
        ax.plot(x, [getattr(lo.quantiles, name) for lo in report.layers], marker=".", label=name)
    if report.after_final_norm is not None:
        q = report.after_final_norm.quantiles
        ax.scatter(
            [x[-1] + 1] * 2,
            [q.p50, q.max],
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


def norm_histograms(norms: NormsResult, bins: int = 60) -> Figure:
    """Histograms of log10 patch-token norms, one row per layer (log counts), thresholds marked."""
    from matplotlib.colors import LogNorm

    trace, report = norms.trace, norms.summary
    entries = list(zip(trace.sites, report.layers, strict=True))
    if trace.final_site and report.after_final_norm is not None:
        entries.append((trace.final_site, report.after_final_norm))
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
        auto = lo_.cut("auto") if "auto" in lo_.thresholds else float("inf")
        if np.isfinite(auto):
            ax.plot([np.log10(auto)] * 2, [row - 0.45, row + 0.45], color="r", lw=1.5)
        if "top_p" in lo_.thresholds:
            ax.plot(
                [np.log10(lo_.cut("top_p"))] * 2,
                [row - 0.45, row + 0.45],
                color="deepskyblue",
                ls=":",
                lw=1.5,
            )
    labels = [
        ("final norm" if lo_.layer is None else f"block {lo_.layer}")
        + (" *" if lo_.artifacts_present else "")
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
    attn: AttentionResult, images: np.ndarray | None, emergence: int | None, source: str
) -> Figure:
    """Head-mean attention maps over the input images at a few layers."""
    picks = map_layers(len(attn.layer_maps), emergence)
    maps = [attn.layer_maps[i].detach().float().cpu().numpy() for i in picks]
    layers = attn.summary.layers
    titles = [f"block {layers[i] if layers[i] is not None else i}" for i in picks]
    fig = overlay_grid(maps, titles, images, "attention")
    caption = (
        f"{_attention_what(attn.summary)}, averaged over heads ({source} attention), over the input "
        f"images. Colour: each column from its {CLIP_TEXT} (clipped)."
    )
    return figure("attention_maps", caption, fig)


def attention_heads(
    attn: AttentionResult, images: np.ndarray | None, max_heads: int = 12
) -> Figure:
    """Per-head attention maps of the last layer over the input images."""
    # layout: axis 1 is heads, not tokens
    heads = attn.last_layer_heads.detach().float().cpu().numpy()[:, :max_heads]
    maps = [heads[:, h] for h in range(heads.shape[1])]
    fig = overlay_grid(maps, [f"head {h}" for h in range(len(maps))], images, "attention")
    caption = (
        f"{_attention_what(attn.summary)} per head in the last block (first {len(maps)} heads). "
        f"Colour: each column from its {CLIP_TEXT} (clipped)."
    )
    return figure("attention_heads", caption, fig)


def _attention_what(attn: Attention) -> str:
    if attn.query == "cls":
        return "[CLS]→patch attention"
    return "Mean attention received by each patch (the model has no [CLS])"


def attention_agreement(attn: Attention) -> Figure:
    """Precision, recall and IoU of attention-map artifacts against norm outliers per layer."""
    fig = new_canvas(6.0, 3.2)
    ax = fig.subplots()
    x = [layer if layer is not None else i for i, layer in enumerate(attn.layers)]
    for key in ("precision", "recall", "iou", "top_p_iou"):
        y = [getattr(a, key) if getattr(a, key) is not None else np.nan for a in attn.agreement]
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


def ln_similarity(ln: LNSeparation) -> Figure:
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
                found = [ln.similarity[b].get(point, {}).get(pair) for b in blocks]
                vals = [v.mean if v is not None else None for v in found]
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


def channel_ownership(ln: LNSeparation) -> Figure:
    """Fraction of channels owned by [CLS] or patches per block, and norm1's gain on them."""
    fig = new_canvas(6.5, 3.2)
    ax = fig.subplots()
    owned = ln.owned_channel_fraction
    x = list(range(len(owned)))
    ax.bar(x, [v if v is not None else 0.0 for v in owned], color="C0")
    ax.set_xlabel("block")
    ax.set_ylabel("owned channel fraction", color="C0")
    gains = [(b, g) for b, g in enumerate(ln.ln1_gain_owned_over_other) if g is not None]
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


def redundancy_maps(red: RedundancyResult, images: np.ndarray | None) -> Figure:
    """Local redundancy (cosine similarity to 4 neighbours) at the patch embedding and a layer."""
    maps = [
        red.embed_maps.detach().float().cpu().numpy(),
        red.layer_maps.detach().float().cpu().numpy(),
    ]
    titles = ["patch embedding", f"block {red.summary.layer}"]
    fig = overlay_grid(maps, titles, images, "neighbour cosine")
    caption = (
        "Local redundancy: mean cosine similarity of each patch to its 4 neighbours at the patch "
        f"embedding (`hook_embed`) and at `{red.summary.layer_site}`. Colour: each column from its "
        f"{CLIP_TEXT} (clipped)."
    )
    return figure("redundancy_maps", caption, fig)


def feature_pictures(pictures: FeaturePicturesResult, images: np.ndarray | None) -> Figure:
    """PCA colours and centre-patch similarity at the analysed layer and after the final norm."""
    columns = []
    for site, p in pictures.by_site.items():
        final = p.summary.where == "after the final norm"
        label = "final norm" if final else site.split(".hook")[0]
        columns.append(GridColumn(f"PCA, {label}", p.basis.rgb(p.features)))
        columns.append(similarity_column(f"similarity, {label}", p))
    first = next(iter(pictures.by_site.values()))
    caption = (
        "The patch features themselves, at "
        + " and ".join(f"`{s.site}` ({s.where})" for s in pictures.summary.sites)
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


def _panel(fig: Any, ax: Any, values: Any, title: str, label: str) -> None:
    im = ax.imshow(np.asarray(values, dtype=float), cmap="magma", interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label=label)


def sink_map(sinks: Sinks) -> Figure:
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


def sink_concentration(conc: SinkConcentration) -> Figure:
    """Heat map of the concentration ratio (mean over images) per block and head, log scale."""
    values = np.log10(np.maximum(np.asarray(conc.mean, dtype=float), 1.0))
    n_blocks, n_heads = values.shape
    fig = new_canvas(1.6 + 0.35 * n_heads, 1.2 + 0.3 * n_blocks)
    ax = fig.subplots()
    im = ax.imshow(values, cmap="magma", interpolation="nearest", aspect="auto")
    ax.set_xlabel("head", fontsize=8)
    ax.set_ylabel("block", fontsize=8)
    ax.set_yticks(range(n_blocks), [str(b) for b in conc.blocks], fontsize=6)
    ax.set_xticks(range(n_heads), [str(h) for h in range(n_heads)], fontsize=6)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="log10 r")
    caption = (
        "Sink concentration ratio r = max_j c_j / median_j c_j of the attention column sums "
        "c_j = sum_i A_ij, mean over images, per block (rows) and head (columns), log10 "
        f"scale; largest: {conc.peak:.3g} at block {conc.peak_block} head {conc.peak_head}."
    )
    return figure("sink_concentration", caption, fig)


def position_maps(pos: Positions) -> Figure:
    """Per-position outlier rate across images, and the position embedding's norm."""
    panels = [(pos.rate_map, f"outlier rate (block {pos.block})", "share of images")]
    if pos.position_embedding is not None:
        panels.append((pos.position_embedding.norm_map, "position embedding", "norm"))
    fig = new_canvas(3.4 * len(panels), 3.2)
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (values, title, label) in zip(axes, panels, strict=True):
        _panel(fig, ax, values, title, label)
    caption = (
        "Position-tied artifacts: share of images in which each patch position is an auto norm "
        "outlier (position-consistency score "
        f"{pos.consistency_score:.2f})"
        + (", and the learned position embedding's norm" if len(panels) > 1 else "")
        + "."
    )
    return figure("position_maps", caption, fig)


def kinds_figures(results: DiagnoseResults) -> list[Figure]:
    """The figures the sink and position results support."""
    figs = []
    if results.sinks is not None:
        figs.append(sink_map(results.sinks))
        if results.sinks.concentration is not None:
            figs.append(sink_concentration(results.sinks.concentration))
    if results.positions is not None:
        figs.append(position_maps(results.positions))
    return figs


def _image_uri(img: np.ndarray) -> str:
    from PIL import Image

    return image_uri(Image.fromarray((img * 255).round().astype(np.uint8)))


def _rounded(x: np.ndarray) -> list[float]:
    return [float(f"{v:.4g}") for v in np.asarray(x, dtype=np.float64).ravel()]


def slider_data(
    result: DiagnoseResult, images: np.ndarray | None, n: int = SLIDER_IMAGES
) -> Slider | None:
    """Per-layer norm (and attention) maps of the first ``n`` images, with clipped colour ranges:
    the block slider of report.html."""
    norms = result.traced.get("norms")
    if not isinstance(norms, NormsResult):
        return None
    trace = norms.trace
    n = min(n, trace.n_images, *([len(images)] if images is not None else []))
    sites = trace.sites + ([trace.final_site] if trace.final_site else [])
    layers = []
    for i, site in enumerate(sites):
        maps = trace.patch_maps(site).numpy()
        lo, hi = clip_range(maps)
        final = site == trace.final_site
        layers.append(
            {
                "label": "after final norm" if final else f"block {i}",
                "site": site,
                "where": "after the final norm" if final else "residual stream",
                "grid": list(maps.shape[1:]),
                "range": [lo, hi],
                "maps": [_rounded(m) for m in maps[:n]],
                "attention": None,
            }
        )
    attn = result.traced.get("attention")
    if isinstance(attn, AttentionResult):
        by_site = {
            site.removesuffix("attn.hook_pattern") + "hook_resid_post": m
            for site, m in zip(attn.summary.sites, attn.layer_maps, strict=True)
        }
        for entry in layers:
            m = by_site.get(entry["site"])
            if m is not None and m.numel():
                m = m.detach().float().cpu().numpy()
                entry["attention"] = {
                    "grid": list(m.shape[1:]),
                    "range": list(clip_range(m)),
                    "maps": [_rounded(x) for x in m[:n]],
                }
    slider = {
        "cmap": colormap_lut().tolist(),
        "images": [_image_uri(img) for img in images[:n]] if images is not None else [],
        "layers": layers,
        "attention": attn.summary.query if isinstance(attn, AttentionResult) else None,
        "start": norms.summary.emergence_layer
        if norms.summary.emergence_layer is not None
        else len(trace.sites) - 1,
    }
    return Slider.model_validate(slider)
