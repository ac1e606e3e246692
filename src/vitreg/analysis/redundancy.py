"""Where outliers sit: local redundancy of each patch, border and background statistics.

Local redundancy is the mean cosine similarity of a patch to its valid 4-neighbours (and,
separately, 8-neighbours), at ``hook_embed`` (the bare patch embedding, where Darcet et al.,
Fig. 5a, find outliers near cosine 1) and at the analysed block output. Outliers come from the
norm analysis at the analysed layer: ``auto`` when the verdict is positive, else ``top_p`` (the
top 2% exist in every model, so that comparison describes high-norm tokens, not artifacts).
Background = patches whose embed redundancy is at or above its 75th percentile over all images.
For hierarchical models the embed maps (stage-0 grid) are average-pooled onto the analysed
stage's grid before they are compared with outliers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import rankdata

from vitreg.analysis.base import Analysis, Finished, Traced
from vitreg.analysis.norms import NormsResult, norm_sites
from vitreg.analysis.rules import SET_RULES as METHODS
from vitreg.analysis.rules import threshold
from vitreg.errors import HookError, VitregError
from vitreg.hooks.reducers import Reducer, TokenNorms
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, TraceResult
from vitreg.results.diagnose import (
    Background,
    Border,
    Placement,
    RateBin,
    RateCurve,
    Redundancy,
    Spread,
)

EMBED_SITE = "hook_embed"
SUMMARY_QUANTILES = (0.1, 0.25, 0.75, 0.9)
N_BINS = 10
BACKGROUND_QUANTILE = 0.75
# (dy, dx) with dy >= 0: each unordered neighbour pair once; the first two are 4-neighbours
_OFFSETS = ((0, 1), (1, 0), (1, 1), (1, -1))


def neighbour_similarity(grid: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean cosine similarity of each patch of ``grid [B, h, w, C]`` to its neighbours.

    Returns ``{"n4": [B, h, w], "n8": [B, h, w]}`` (float32); at borders only neighbours inside
    the grid count; a patch without neighbours (1x1 grid) gets NaN.
    """
    unit = F.normalize(grid.float(), dim=-1)
    b, h, w, _ = unit.shape
    sums = {k: unit.new_zeros(b, h, w) for k in ("n4", "n8")}
    counts = {k: unit.new_zeros(h, w) for k in ("n4", "n8")}
    for i, (dy, dx) in enumerate(_OFFSETS):
        ya, yb = slice(0, h - dy), slice(dy, h)
        xa, xb = slice(max(0, -dx), w - max(0, dx)), slice(max(0, dx), w - max(0, -dx))
        cos = (unit[:, ya, xa] * unit[:, yb, xb]).sum(-1)
        for k in ("n4", "n8") if i < 2 else ("n8",):
            sums[k][:, ya, xa] += cos
            sums[k][:, yb, xb] += cos
            counts[k][ya, xa] += 1
            counts[k][yb, xb] += 1
    return {k: sums[k] / counts[k].where(counts[k] > 0, torch.nan) for k in sums}


class NeighbourMaps(TypedDict):
    """4- and 8-neighbour redundancy maps ``[n_images, h, w]`` of one site and its grid."""

    n4: torch.Tensor
    n8: torch.Tensor
    grid: tuple[int, int]


class NeighbourSimilarity(TokenNorms):
    """Per-image 4- and 8-neighbour redundancy maps of one site's patch grid.

    Rows ``[n4 | n8]`` (``2 * h * w`` floats per image) go into :class:`TokenNorms`' growing
    buffer, which keeps memory bounded and merges across processes the same way.
    """

    def __init__(self, site: str) -> None:
        super().__init__(site)
        self.grid: tuple[int, int] | None = None

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        if t.dim() != 4 and ctx.layout is None:
            raise HookError(f"{self.site!r} has no token layout, so its patch grid is unknown")
        grid = t if t.dim() == 4 else ctx.layout.patch_grid(t)
        self.grid = (int(grid.shape[1]), int(grid.shape[2]))
        sims = neighbour_similarity(grid)
        rows = torch.cat([sims["n4"].flatten(1), sims["n8"].flatten(1)], dim=1).cpu()
        self._put(torch.arange(image_offset, image_offset + rows.shape[0]), rows)

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, NeighbourSimilarity)
        super().merge(other)
        self.grid = self.grid or other.grid

    def result(self) -> NeighbourMaps:  # type: ignore[override]
        rows = super().result()["norms"]
        h, w = self.grid or (0, 0)
        maps = rows.reshape(rows.shape[0], 2, h, w)
        # layout: axis 1 holds the two neighbourhoods (4, 8), not tokens
        return NeighbourMaps(n4=maps[:, 0], n8=maps[:, 1], grid=(h, w))


def _summary(x: np.ndarray) -> Spread | None:
    if not x.size:
        return None
    qs = np.quantile(x, SUMMARY_QUANTILES)
    out = {f"p{round(q * 100)}": float(v) for q, v in zip(SUMMARY_QUANTILES, qs, strict=True)}
    return Spread(n=int(x.size), mean=float(x.mean()), median=float(np.median(x)), **out)


def _auc(pos: np.ndarray, neg: np.ndarray) -> float | None:
    """P(outlier redundancy > normal redundancy), ties counted half (Mann-Whitney U / n1 n0)."""
    if not pos.size or not neg.size:
        return None
    ranks = rankdata(np.r_[pos, neg])
    return float((ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2) / (pos.size * neg.size))


def _rate(mask: np.ndarray, where: np.ndarray) -> float | None:
    return float(mask[where].mean()) if where.any() else None


def rate_by_redundancy(r: np.ndarray, mask: np.ndarray, n_bins: int = N_BINS) -> RateCurve:
    """Outlier rate per quantile bin of redundancy ``r`` (tied edges merge bins)."""
    edges = np.unique(np.quantile(r, np.linspace(0, 1, n_bins + 1))) if r.size else np.zeros(1)
    if edges.size < 2:
        edges = np.r_[edges[:1], edges[:1]]
    idx = np.clip(np.searchsorted(edges, r, side="right") - 1, 0, edges.size - 2)
    bins = []
    for i in range(edges.size - 1):
        sel = idx == i
        bins.append(
            RateBin(
                lo=float(edges[i]),
                hi=float(edges[i + 1]),
                n=int(sel.sum()),
                mean_redundancy=float(r[sel].mean()) if sel.any() else None,
                outlier_rate=_rate(mask, sel),
            )
        )
    return RateCurve(measure="embed_n4", binning=f"{n_bins} quantile bins", bins=bins)


@dataclass
class RedundancyResult(Traced):
    """Redundancy maps at the embedding and the analysed layer, the outlier mask there, and the
    summary of where outliers sit."""

    embed: dict[str, torch.Tensor]  # "n4"/"n8" -> [n_images, H0, W0] at hook_embed
    at_layer: dict[str, torch.Tensor]  # "n4"/"n8" -> [n_images, h, w] at the analysed layer
    outliers: torch.Tensor  # bool [n_images, h, w] at the analysed layer under its rule
    max_maps: int
    summary: Redundancy

    @property
    def embed_maps(self) -> torch.Tensor:
        """``[n_maps, H0, W0]`` 4-neighbour redundancy at ``hook_embed`` (stage-0 grid)."""
        return self.embed["n4"][: self.max_maps]

    @property
    def layer_maps(self) -> torch.Tensor:
        """``[n_maps, h, w]`` 4-neighbour redundancy at the analysed layer."""
        return self.at_layer["n4"][: self.max_maps]


def _on_grid(maps: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """``maps [n, H, W]`` average-pooled onto ``grid`` (identity when it already matches)."""
    if tuple(maps.shape[1:]) == tuple(grid):
        return maps
    # layout: the channel axis pooling needs, not tokens
    return F.adaptive_avg_pool2d(maps[:, None], grid)[:, 0]


def _border_mask(n: int, h: int, w: int) -> np.ndarray:
    ring = np.zeros((h, w), dtype=bool)
    ring[[0, -1], :] = True
    ring[:, [0, -1]] = True
    return np.broadcast_to(ring, (n, h, w)).ravel()


def placement(
    embed_n4: torch.Tensor, measures: dict[str, torch.Tensor], mask: torch.Tensor
) -> tuple[dict[str, Placement], RateCurve, Border, Background]:
    """(outlier vs normal per measure, rate-by-redundancy curve, border, background) statistics.

    ``embed_n4`` and every measure are ``[n, h, w]`` on the grid of the bool outlier ``mask``.
    """
    m = mask.numpy().ravel()
    r = embed_n4.numpy().ravel()
    ok = np.isfinite(r)
    vs = {}
    for name, values in measures.items():
        v = values.numpy().ravel()
        fin = np.isfinite(v)
        pos, neg = v[fin & m], v[fin & ~m]
        vs[name] = Placement(outlier=_summary(pos), normal=_summary(neg), auc=_auc(pos, neg))
    curve = rate_by_redundancy(r[ok], m[ok])
    n, h, w = mask.shape
    ring = _border_mask(n, h, w)
    rb, ri = _rate(m, ring), _rate(m, ~ring)
    border = Border(
        definition="outermost ring of patches at the analysed layer",
        n_border=int(ring.sum()),
        n_interior=int((~ring).sum()),
        outlier_rate_border=rb,
        outlier_rate_interior=ri,
        border_over_interior=rb / ri if rb is not None and ri else None,
    )
    cut = float(np.quantile(r[ok], BACKGROUND_QUANTILE)) if ok.any() else math.nan
    bg = ok & (r >= cut)
    background = Background(
        definition=f"embed n4 redundancy >= its p{round(BACKGROUND_QUANTILE * 100)} "
        "over all images",
        threshold=cut if math.isfinite(cut) else None,
        fraction=float(bg[ok].mean()) if ok.any() else 0.0,
        outlier_rate_background=_rate(m, bg),
        outlier_rate_foreground=_rate(m, ok & ~bg),
        outlier_share_in_background=float(bg[m].mean()) if m.any() else 0.0,
    )
    return vs, curve, border, background


class RedundancyAnalysis(Analysis):
    """Local redundancy at the embedding and one block output; how outliers relate to it.

    ``layer``: ``None`` (the last block output), an index into the block outputs (negative
    counts from the end) or a block-output site name. ``method``: force an outlier rule
    (default: ``auto`` when the norm verdict is positive, else ``top_p``). Needs
    :class:`~vitreg.analysis.norms.NormAnalysis` earlier in the same :func:`run_analyses`.
    """

    name = "redundancy"

    def __init__(
        self, max_maps: int = 8, layer: int | str | None = None, method: str | None = None
    ) -> None:
        if method is not None and method not in METHODS:
            raise ValueError(f"unknown outlier method {method!r}; choose from {METHODS}")
        self.max_maps = max_maps
        self.layer = layer
        self.method = method

    def not_applicable(self, model: Model) -> str | None:
        if EMBED_SITE not in model.hook_names():
            return f"the model exposes no {EMBED_SITE} site (bare patch embedding)"
        if not norm_sites(model)[0]:
            return "the model exposes no block-output (hook_resid_post) sites"
        return None

    def site(self, model: Model) -> tuple[str, int]:
        """The analysed block-output site and its index among block outputs."""
        sites = norm_sites(model)[0]
        if self.layer is None:
            return sites[-1], len(sites) - 1
        if isinstance(self.layer, int):
            if not -len(sites) <= self.layer < len(sites):
                raise HookError(
                    f"layer {self.layer} is out of range: the model has {len(sites)} block outputs"
                )
            i = self.layer % len(sites)
            return sites[i], i
        if self.layer not in sites:
            raise HookError(
                f"{self.layer!r} is not a block-output site; choose one of {sites[0]!r} .. "
                f"{sites[-1]!r} (or pass an index)"
            )
        return self.layer, sites.index(self.layer)

    def reducers(self, model: Model) -> list[Reducer]:
        return [NeighbourSimilarity(EMBED_SITE), NeighbourSimilarity(self.site(model)[0])]

    def finish(
        self, model: Model, trace: TraceResult, done: dict[str, Finished]
    ) -> RedundancyResult:
        norms = done.get("norms")
        if not isinstance(norms, NormsResult):
            raise VitregError(
                "RedundancyAnalysis needs the norm outliers: run it after NormAnalysis in one "
                "run_analyses call, e.g. run_analyses(model, data, [NormAnalysis(), "
                "RedundancyAnalysis()])"
            )
        site, index = self.site(model)
        embed = trace[EMBED_SITE][0].result()
        at_layer = trace[site][0].result()
        method, reason = self._method(norms)
        mask = self._mask(norms, site, method)
        grid = tuple(mask.shape[1:])
        measures = {
            "embed_n4": _on_grid(embed["n4"], grid),
            "embed_n8": _on_grid(embed["n8"], grid),
            "layer_n4": at_layer["n4"],
            "layer_n8": at_layer["n8"],
        }
        vs, curve, border, background = placement(measures["embed_n4"], measures, mask)
        notes = []
        if embed["grid"] != grid:
            notes.append(
                f"embed redundancy average-pooled from {embed['grid'][0]}x{embed['grid'][1]} "
                f"to the analysed grid {grid[0]}x{grid[1]}"
            )
        if not mask.any():
            notes.append(
                f"no outliers at {site} under {method!r}: there is nothing to place, so outlier "
                "rates are zero and outlier summaries are empty"
            )
        summary = Redundancy(
            embed_site=EMBED_SITE,
            layer_site=site,
            layer=index,
            embed_grid=list(embed["n4"].shape[1:]),
            layer_grid=list(at_layer["n4"].shape[1:]),
            measure="mean cosine similarity to the valid 4- (n4) and 8-neighbours (n8)",
            outlier_method=method,
            outlier_method_reason=reason,
            n_outliers=int(mask.sum()),
            outlier_rate=float(mask.float().mean()) if mask.numel() else 0.0,
            note="; ".join(notes) or None,
            outlier_vs_normal=vs,
            rate_by_redundancy=curve,
            border=border,
            background=background,
        )
        pair = ("n4", "n8")
        return RedundancyResult(
            {k: embed[k] for k in pair},
            {k: at_layer[k] for k in pair},
            mask,
            self.max_maps,
            summary,
        )

    def _method(self, norms: NormsResult) -> tuple[str, str]:
        if self.method is not None:
            return self.method, "chosen by the caller"
        if norms.summary.artifacts_present:
            return "auto", "artifact verdict positive: the bimodal (auto) outlier split"
        return "top_p", (
            "artifact verdict negative, so 'auto' flags nothing; comparing the top-p% norm "
            "tokens, which every model has (not evidence of artifacts)"
        )

    def _mask(self, norms: NormsResult, site: str, method: str) -> torch.Tensor:
        layer = norms.site(site)
        cut = layer.cut(method) if method in layer.thresholds else None
        if cut is None:
            cut = threshold(norms.trace.patch_norms(site).numpy(), method)
        return norms.trace.patch_maps(site) > cut
