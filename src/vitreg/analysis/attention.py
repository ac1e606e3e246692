"""Attention artifacts: attention maps per layer, sink statistics, and agreement with norm outliers.

Everything is read from ``attn.hook_pattern`` (native probabilities, or recomputed from q/k when
the source uses fused attention; the result records which) in the same single pass as the norms.

- **Map** per image and layer (head mean; per head for the last layer): the [CLS] row restricted
  to patch columns; without [CLS] (SigLIP, Swin, PVT-v2), the *mean attention received* by each
  patch, averaged over queries. Swin: over the queries of the patch's own (shifted) window, mapped
  back to grid positions with the shift undone. PVT-v2: received attention lives on the spatially
  reduced key grid, so its map is on that grid.
- **Sinks** per layer (mean over images, heads and the queries used): attention mass on the
  top-k keys of a row (keys: every token, prefix included; Swin: the query's window; PVT-v2: the
  reduced keys), row entropy in nats, and the largest map value (max [CLS]->patch attention).
- **Attention artifacts** per image and layer: patches whose log attention exceeds that image's
  median + 3.5 x 1.4826 x MAD (the robust z-score rule of the norm analysis, applied to each
  map, :func:`vitreg.analysis.rules.robust_mask`; with MAD 0, 1.2533 x the mean absolute
  deviation instead; a constant map flags nothing).
- **Agreement** at each layer with the norm outliers of the same block's output: precision
  (artifacts that are norm outliers), recall (norm outliers that are artifacts), IoU and overlap
  coefficient (|A and N| / min(|A|, |N|)), pooled over images; 0/0 is ``None``. Norm outliers use the
  ``auto`` rule when the norm verdict is positive, else ``top_p`` (recorded), and ``top_p_iou``
  compares top-p% attention with top-p% norms (the reassessment's overlap). Maps not on the token
  grid (PVT-v2 reduced keys) give no agreement, with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import torch

from vitreg.analysis.base import Analysis, Finished, Traced
from vitreg.analysis.norms import NormsResult
from vitreg.analysis.rules import MAD_SCALE, Z_CUT, robust_mask, threshold
from vitreg.errors import InputError
from vitreg.hooks.attention import PatternSite
from vitreg.hooks.patterns import PatternReading, Reader
from vitreg.hooks.reducers import Reducer
from vitreg.hooks.sites import HookContext
from vitreg.hooks.streamed import StreamedPattern, row_means
from vitreg.models.model import Model, TraceResult
from vitreg.results.diagnose import Agreement, Attention, AttentionSummary

Grid = tuple[int, int]


def row_stats(
    rows: torch.Tensor | StreamedPattern, ks: Sequence[int], weights: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Per image ``[B]``: top-k key mass and entropy (nats) of each row, averaged over the rest."""
    if isinstance(rows, StreamedPattern):
        return row_means(rows, ks)
    rows = rows.float()
    per_row = {f"top{k}": rows.topk(min(k, rows.shape[-1]), dim=-1).values.sum(-1) for k in ks}
    per_row["entropy"] = -torch.special.xlogy(rows, rows).sum(-1)
    dims = tuple(range(1, rows.dim() - 1))
    out = {}
    for name, v in per_row.items():
        if weights is None:
            out[name] = v.mean(dims)
        else:
            w = weights.to(v).expand(v.shape[1:])
            out[name] = (v * w).sum(dims) / w.sum()
    return out


class _Rows:
    """Per-image rows in growing buffers indexed by image (doubling from ``least`` images: no
    per-batch fragments)."""

    def __init__(self, least: int = 64) -> None:
        self.data: dict[str, torch.Tensor] = {}
        self.filled = torch.zeros(0, dtype=torch.bool)
        self.least = least

    def put(self, index: torch.Tensor, rows: dict[str, torch.Tensor]) -> None:
        if not len(index):
            return
        cap = len(self.filled)
        if int(index.max()) >= cap:
            cap = max(int(index.max()) + 1, 2 * cap, self.least)
            self.filled = torch.cat(
                [self.filled, torch.zeros(cap - len(self.filled), dtype=torch.bool)]
            )
        for k, v in rows.items():
            old = self.data.get(k)
            if old is not None and old.shape[1:] != v.shape[1:]:
                raise InputError(
                    f"attention rows changed shape from {tuple(old.shape[1:])} to "
                    f"{tuple(v.shape[1:])}; trace images of one size per run"
                )
            if old is None or len(old) < cap:
                grown = torch.zeros(cap, *v.shape[1:], dtype=v.dtype)
                if old is not None:
                    grown[: len(old)] = old
                self.data[k] = grown
            self.data[k][index] = v.cpu()
        self.filled[index] = True

    def merge(self, other: _Rows) -> None:
        index = other.filled.nonzero().squeeze(1)
        self.put(index, {k: v[index] for k, v in other.data.items()})

    def get(self) -> dict[str, torch.Tensor]:
        index = self.filled.nonzero().squeeze(1)
        return {k: v[index] for k, v in self.data.items()}


class MapStats(TypedDict):
    """Per image ``[n]`` of one pattern site: the head-mean map ``[n, h * w]``, its largest
    value, row entropy and top-k key mass by k; per-head maps ``[n_kept, H, h, w]`` of the first
    images (``None``: none kept); the map's grid, the token grid and the number of keys."""

    map: torch.Tensor
    max: torch.Tensor
    entropy: torch.Tensor
    top: dict[int, torch.Tensor]
    heads: torch.Tensor | None
    grid: Grid | None
    token_grid: Grid | None
    n_keys: int


class AttentionMaps(Reducer[MapStats]):
    """One pattern site: per-image head-mean maps and sink statistics; per-head maps for the
    first ``keep_heads`` images."""

    def __init__(
        self, site: str, reader: Reader, ks: Sequence[int] = (1, 5), keep_heads: int = 0
    ) -> None:
        super().__init__(site)
        self.reader, self.ks, self.keep_heads = reader, tuple(ks), keep_heads
        self.rows, self.heads = _Rows(), _Rows(least=max(1, keep_heads))
        self.grid: Grid | None = None
        self.token_grid: Grid | None = None
        self.n_keys = 0

    streams_patterns = True

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        read = self.reader(t if isinstance(t, StreamedPattern) else t.float(), ctx.layout)
        heads = read.heads
        amap = heads.mean(1).flatten(1)
        self.grid, self.token_grid = tuple(heads.shape[-2:]), read.token_grid
        self.n_keys = int(read.rows.shape[-1])
        stats = row_stats(read.rows, self.ks, read.weights)
        index = torch.arange(image_offset, image_offset + amap.shape[0])
        self.rows.put(index, {"map": amap.cpu(), "max": amap.amax(1).cpu(), **stats})
        keep = max(0, min(amap.shape[0], self.keep_heads - image_offset))
        self.heads.put(index[:keep], {"heads": heads[:keep].cpu()})

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, AttentionMaps)
        self.rows.merge(other.rows)
        self.heads.merge(other.heads)
        self.grid, self.token_grid = self.grid or other.grid, self.token_grid or other.token_grid
        self.n_keys = self.n_keys or other.n_keys
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> MapStats:
        rows, none = self.rows.get(), torch.empty(0)
        return MapStats(
            map=rows.get("map", none),
            max=rows.get("max", none),
            entropy=rows.get("entropy", none),
            top={k: rows.get(f"top{k}", none) for k in self.ks},
            heads=self.heads.get().get("heads"),
            grid=self.grid,
            token_grid=self.token_grid,
            n_keys=self.n_keys,
        )


def artifact_masks(maps: torch.Tensor, z: float = Z_CUT) -> torch.Tensor:
    """Bool like ``maps [n, h, w]``: log attention above each image's median + z * 1.4826 * MAD.

    The robust rule of :mod:`vitreg.analysis.rules` on each map: when more than half of a map is
    one value (MAD 0), 1.2533 x the mean absolute deviation stands in for the MAD (the usual
    modified z-score fallback); a constant map flags nothing.
    """
    return robust_mask(maps.flatten(1), z, floor=1e-30).reshape(maps.shape)


def agreement(attn_mask: torch.Tensor, norm_mask: torch.Tensor) -> dict[str, float | int | None]:
    """Precision, recall, IoU and overlap coefficient of two bool masks, pooled (0/0 -> None)."""
    a, n = attn_mask.bool(), norm_mask.bool()
    both, na, nn_ = int((a & n).sum()), int(a.sum()), int(n.sum())
    union = int((a | n).sum())

    def ratio(num: int, den: int) -> float | None:
        return num / den if den else None

    return {
        "precision": ratio(both, na),
        "recall": ratio(both, nn_),
        "iou": ratio(both, union),
        "overlap": ratio(both, min(na, nn_)),
        "n_attention": na,
        "n_norm": nn_,
        "n_both": both,
    }


def _top_p_mask(values: torch.Tensor, p: float) -> torch.Tensor:
    return values > threshold(values.numpy(), "top_p", p=p)


@dataclass
class AttentionResult(Traced):
    """Attention maps of the kept images per layer (forward order), and the summary."""

    layer_maps: list[torch.Tensor]  # per layer [n_maps, h_l, w_l] head-mean maps
    artifact_maps: list[torch.Tensor]  # per layer [n_maps, h_l, w_l] bool attention artifacts
    last_layer_heads: torch.Tensor  # [n_maps, H, h, w]
    summary: Attention

    @property
    def map_layers(self) -> list[int]:
        """Indices (into the per-layer lists) of layers whose map grid is the last layer's."""
        last = tuple(self.layer_maps[-1].shape[-2:])
        return [i for i, m in enumerate(self.layer_maps) if tuple(m.shape[-2:]) == last]

    @property
    def maps(self) -> torch.Tensor:
        """``[n_maps, L, h, w]`` head-mean maps of :attr:`map_layers` (all layers of a plain ViT)."""
        return torch.stack([self.layer_maps[i] for i in self.map_layers], dim=1)


def attention_summary(
    sites: list[str],
    layers: list[int | None],
    stats: dict[str, list[float]],
    ks: Sequence[int],
    agreement: list[Agreement],
) -> AttentionSummary:
    """The numbers of the last attention layer."""
    return AttentionSummary(
        layer=layers[-1],
        site=sites[-1],
        sink_mass={str(k): stats[f"top{k}"][-1] for k in ks},
        entropy=stats["entropy"][-1],
        cls_to_patch_max=stats["max"][-1],
        artifact_rate=stats["rate"][-1],
        agreement=agreement[-1],
    )


def _pattern_sites(model: Model) -> list[str]:
    return [n for n in model.hook_names() if n.endswith("attn.hook_pattern")]


def _reading(model: Model, name: str) -> PatternReading:
    """How one pattern site is read (the site knows its geometry)."""
    site = model.site(name)
    if not isinstance(site, PatternSite):
        raise InputError(f"{name!r} is not an attention pattern site")
    return site.reading(model.layout)


def _definitions(reading: PatternReading, ks: Sequence[int], z: float) -> dict[str, str]:
    queries = "the [CLS] row" if reading.query == "cls" else "every query, averaged"
    return {
        "map": f"head mean; {reading.how}",
        "sink_mass": f"mass of the top-k keys (k in {tuple(ks)}) of {queries}; keys: "
        f"{reading.keys}; mean over images and heads",
        "entropy": f"entropy in nats of {queries}; mean over images and heads",
        "cls_to_patch_max": "largest value of the head-mean map, mean over images",
        "artifact": f"log attention > median + {z} * {MAD_SCALE} * MAD of the image's map",
        "agreement": "attention artifacts vs norm outliers of the same block's output, pooled "
        "over images: precision = |A&N|/|A|, recall = |A&N|/|N|, iou, overlap = |A&N|/min",
    }


class AttentionAnalysis(Analysis):
    """Attention maps, sinks and attention/norm agreement (run after :class:`NormAnalysis`).

    ``max_maps``: images whose maps (and last-layer per-head maps) are kept for figures; every
    image feeds the statistics. ``k``: top-k sizes for the sink mass. ``top_p``: the norm rule
    used when the norm verdict is negative, and the percentage of ``top_p_iou``. ``z``: the
    robust cut of attention artifacts.
    """

    name = "attention"

    def __init__(
        self,
        max_maps: int = 8,
        k: Sequence[int] = (1, 5),
        top_p: float = 2.0,
        z: float = Z_CUT,
    ) -> None:
        self.max_maps, self.ks, self.top_p, self.z = max_maps, tuple(k), top_p, z

    def not_applicable(self, model: Model) -> str | None:
        if not _pattern_sites(model):
            return "the model exposes no attn.hook_pattern sites"
        return None

    def reducers(self, model: Model) -> list[Reducer]:
        names = _pattern_sites(model)
        last = len(names) - 1
        return [
            AttentionMaps(n, _reading(model, n).read, self.ks, self.max_maps if i == last else 0)
            for i, n in enumerate(names)
        ]

    def finish(
        self, model: Model, trace: TraceResult, done: dict[str, Finished]
    ) -> AttentionResult:
        if trace.n_images == 0:
            raise InputError("no images were traced, so there is no attention to analyse")
        reducers = [r for r in trace.reducers if isinstance(r, AttentionMaps)]
        sites = [r.site for r in reducers]
        reading = _reading(model, sites[0])
        norms = done.get("norms")
        if not isinstance(norms, NormsResult):
            norms = None
        method = None if norms is None else ("auto" if norms.summary.artifacts_present else "top_p")
        notes = [] if norms is not None else ["no norm results: run NormAnalysis first"]
        maps, arts, heads, agree = [], [], torch.empty(0), []
        stats: dict[str, list[float]] = {}
        for r in reducers:
            res = r.result()
            amap = res["map"].reshape(-1, *res["grid"])
            art = artifact_masks(amap, self.z)
            maps.append(amap[: self.max_maps])
            arts.append(art[: self.max_maps])
            heads = res["heads"] if res["heads"] is not None else heads
            stats.setdefault("max", []).append(float(res["max"].mean()))
            stats.setdefault("entropy", []).append(float(res["entropy"].mean()))
            for k in self.ks:
                stats.setdefault(f"top{k}", []).append(float(res["top"][k].mean()))
            stats.setdefault("rate", []).append(float(art.float().mean()))
            agree.append(self._agree(r, amap, art, norms, method))
        reasons = sorted({a.reason for a in agree if a.reason is not None})
        notes += [f"agreement not computed at some layers: {why}" for why in reasons]
        layers = [model.site(s).layer for s in sites]
        n_keys = [r.n_keys for r in reducers]
        sources = sorted({trace.attn_source[s] for s in sites if s in trace.attn_source})
        summary = Attention(
            query=reading.query,
            definitions=_definitions(reading, self.ks, self.z),
            attention_source=sources[0] if len(sources) == 1 else sources,
            norm_method=method,
            summary=attention_summary(sites, layers, stats, self.ks, agree),
            sites=sites,
            layers=layers,
            map_grid=[list(m.shape[-2:]) for m in maps],
            n_keys=n_keys,
            sink_mass={str(k): stats[f"top{k}"] for k in self.ks},
            entropy=stats["entropy"],
            entropy_normalized=[
                e / math.log(k) if k > 1 else None
                for e, k in zip(stats["entropy"], n_keys, strict=True)
            ],
            cls_to_patch_max=stats["max"],
            artifact_rate=stats["rate"],
            agreement=agree,
            notes=notes,
        )
        return AttentionResult(maps, arts, heads, summary)

    def _agree(
        self,
        r: AttentionMaps,
        maps: torch.Tensor,
        art: torch.Tensor,
        norms: NormsResult | None,
        method: str | None,
    ) -> Agreement:
        """Agreement of one layer's attention artifacts with the norm outliers of its block output."""
        norm_site = r.site.removesuffix("attn.hook_pattern") + "hook_resid_post"
        if r.token_grid is None or tuple(r.grid) != tuple(r.token_grid):
            return Agreement(
                norm_site=norm_site,
                norm_method=method,
                reason="the map is on the spatially reduced key grid, not on the token grid, "
                "so it cannot be matched to token norms",
            )
        if norms is None or norm_site not in norms.trace.norms:
            why = f"no norms at {norm_site} (run NormAnalysis first)"
            return Agreement(norm_site=norm_site, norm_method=method, reason=why)
        values = norms.trace.patch_maps(norm_site)
        if method == "auto":
            outl = norms.masks(norm_site, "auto")
        else:
            outl = _top_p_mask(values, self.top_p)
        top = agreement(_top_p_mask(maps, self.top_p), _top_p_mask(values, self.top_p))
        return Agreement(
            norm_site=norm_site,
            norm_method=method,
            **agreement(art, outl),
            top_p_iou=top["iou"],
            top_p=self.top_p,
        )
