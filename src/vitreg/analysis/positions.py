"""Position-tied artifacts: the same patch positions stand out in every image, whatever it shows.

SigLIP's learned position embedding gives edge patches norms of ~313 against ~18 elsewhere, one
channel carrying 82% of it, and attention lands on the same positions across images (openpi
#947, VisionZip #28); DINOv2 ViT-B has high-norm clusters in its top-left patches (dinov2 #419).
Three views, none of which assumes the outliers are content-driven:

* per-position statistics across images: how often each position is an ``auto`` norm outlier
  (and, where maps were kept, an attention artifact); positions hit in >= 90% of the images are
  *consistent*; the position-consistency score is the share of all outlier hits that fall on
  consistent positions (1: every outlier sits at a fixed position; ~0: content-tied);
* the norm of the position embedding itself per position, its max over median, and the share
  of the largest channel in the high positions' norm;
* the response to constant images (all-grey pixels, and all-zero after normalisation): with no
  content, any patch at >= 3x the median patch norm is there because of its position.

Position-tied artifacts are reported present when some block has consistent outlier positions
with a score >= 0.5 that the constant images reproduce.
"""

from __future__ import annotations

import torch

from vitreg.analysis.attention import AttentionResult
from vitreg.analysis.base import Analysis, Finished, run_analyses
from vitreg.analysis.massive import HIGH_NORM
from vitreg.analysis.norms import NormAnalysis, NormsResult
from vitreg.core.renamed import renamed
from vitreg.hooks.reducers import Reducer
from vitreg.models.model import Model, TraceResult
from vitreg.results.kinds import PositionEmbedding, Positions

CONSISTENT = 0.9  # share of images in which a position must be an outlier
MIN_SCORE = 0.5
MIN_IMAGES = 4  # fewer images say nothing about consistency
RULE = (
    f"a patch position is consistent when it is an auto norm outlier in >= {CONSISTENT:.0%} of "
    "the images; score = share of all outlier hits on consistent positions; position-tied when "
    f"a block has consistent positions, score >= {MIN_SCORE} and constant images (grey, zero) "
    f"put those positions at >= {HIGH_NORM:g}x the median patch norm"
)


def tied(positions: list[list[int]], score: float, constant: dict[str, list[list[int]]]) -> bool:
    """Whether consistent ``positions`` with this ``score`` are position-tied artifacts: the
    constant images put some of them high too."""
    if not positions or score < MIN_SCORE:
        return False
    return any(set(map(tuple, positions)) & set(map(tuple, p)) for p in constant.values())


def consistency(hits: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(rate [P], score)`` of bool outlier hits ``[n_images, P]``: per-position hit rate and
    the share of all hits on positions with rate >= :data:`CONSISTENT`."""
    rate = hits.double().mean(0)
    total = int(hits.sum())
    on = int(hits[:, rate >= CONSISTENT].sum())
    return rate, (on / total if total else 0.0)


def _cells(mask: torch.Tensor, w: int) -> list[list[int]]:
    return [[int(i) // w, int(i) % w] for i in mask.nonzero().flatten().tolist()]


def pos_embed_stats(model: Model, grid: tuple[int, int]) -> PositionEmbedding | None:
    """Norm per patch position of the learned position embedding (None: the model has none,
    e.g. RoPE, or its grid differs from the traced one)."""
    module = model.module
    found = getattr(module, "pos_embed", None)
    if found is None:
        emb = getattr(module, "embeddings", None) or getattr(
            getattr(module, "vision_model", None), "embeddings", None
        )
        found = getattr(getattr(emb, "position_embedding", None), "weight", None)
        found = found if found is not None else getattr(emb, "position_embeddings", None)
    if not isinstance(found, torch.Tensor):
        return None
    table = found.detach().float().reshape(-1, found.shape[-1])
    n = grid[0] * grid[1]
    if table.shape[0] < n:
        return None
    patches = table[-n:]
    norms = patches.norm(dim=-1)
    med = float(norms.median())
    high = norms >= HIGH_NORM * med
    share = None
    if high.any():
        energy = (patches[high] ** 2).sum(0)
        share = float(energy.max() / energy.sum().clamp_min(1e-12))
    return PositionEmbedding(
        norm_map=norms.reshape(grid).tolist(),
        median=med,
        max_over_median=float(norms.max()) / max(med, 1e-12),
        high_positions=_cells(high, grid[1]),
        top_channel_share_of_high=share,
    )


def constant_images(
    model: Model, size: tuple[int, int], sites: list[str], block: int
) -> dict[str, list[list[int]]]:
    """Positions at >= 3x the median patch norm in block ``block`` for a grey and a zero image."""
    cfg = model.adapter.data_config()
    mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    grey = (0.5 - mean) / std * torch.ones(1, 3, *size)
    x = torch.cat([grey, torch.zeros(1, 3, *size)]).to(model.device, model.dtype)
    res, _, _ = run_analyses(model, x, [NormAnalysis()])
    found = res["norms"]
    assert isinstance(found, NormsResult)
    trace = found.trace
    site = sites[block]
    norms = trace.patch_norms(site)
    high = norms >= HIGH_NORM * norms.median(dim=1, keepdim=True).values
    w = trace.layouts[site].grid[1]
    return {"grey": _cells(high[0], w), "zero": _cells(high[1], w)}


def analyse_positions(
    model: Model, norms: NormsResult, attention: AttentionResult | None = None
) -> Positions:
    """Per-position statistics from the norm results (and attention maps, if any)."""
    trace = norms.trace
    notes: list[str] = []
    best: tuple[int, tuple[int, int], torch.Tensor, float] | None = None
    for i, site in enumerate(trace.sites):
        hits = norms.masks(site, "auto").flatten(1)
        rate, score = consistency(hits)
        key = (int(hits[:, rate >= CONSISTENT].sum()), int(hits.sum()))
        if key[1] and (best is None or key > best[1]):
            best = (i, key, rate, score)
    layout = trace.layouts[trace.sites[-1]]
    h, w = layout.grid
    if trace.n_images < MIN_IMAGES:
        notes.append(f"{trace.n_images} images: consistency across images needs >= {MIN_IMAGES}")
        best = None
    if best is None:
        block, positions, score, rate = None, [], 0.0, torch.zeros(h * w)
        constant = {}
    else:
        block, _, rate, score = best
        positions = _cells(rate >= CONSISTENT, w)
        size = (h * layout.patch_size[0], w * layout.patch_size[1])
        constant = constant_images(model, size, trace.sites, block) if positions else {}
    pos = pos_embed_stats(model, (h, w))
    if pos is None:
        notes.append("no learned position embedding at the traced grid (RoPE or resized)")
    return Positions(
        present=tied(positions, score, constant),
        rule=RULE,
        n_images=trace.n_images,
        block=block,
        positions=positions,
        consistency_score=score,
        rate_map=rate.reshape(h, w).tolist(),
        constant_images=constant,
        position_embedding=pos,
        attention_consistent_positions=_attention_positions(attention),
        notes=notes,
    )


def _attention_positions(attention: AttentionResult | None) -> list[list[int]]:
    """Positions that are attention artifacts in >= 90% of the kept maps of the last layer."""
    if attention is None or not attention.artifact_maps:
        return []
    maps = attention.artifact_maps[-1]
    if maps.shape[0] < MIN_IMAGES:
        return []
    rate = maps.flatten(1).double().mean(0)
    return _cells(rate >= CONSISTENT, maps.shape[-1])


class PositionAnalysis(Analysis):
    """Position-tied artifacts, from the norm trace (run NormAnalysis first)."""

    name = "positions"

    def reducers(self, model: Model) -> list[Reducer]:
        return []

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> Positions:
        norms, attention = done.get("norms"), done.get("attention")
        if not isinstance(norms, NormsResult):
            raise ValueError("PositionAnalysis needs the norm results: put NormAnalysis first")
        return analyse_positions(
            model, norms, attention if isinstance(attention, AttentionResult) else None
        )


__getattr__ = renamed(__name__, {"PositionResult": "Positions"}, globals())
