"""Anomaly tokens by Local Outlier Factor (SC-CLIP, Bai et al. 2024), beside the norm rules.

SC-CLIP flags "anomaly tokens" in the penultimate block with scikit-learn's
``LocalOutlierFactor(n_neighbors=30, contamination=0.05)``: the 5% of patch tokens of one image
whose local density is lowest, whatever their norm -- no bimodal norm distribution assumed. Here
the same detector runs per image on the patch tokens of the penultimate block output, on a
bounded sample (the first ``max_images`` images, at most ``max_tokens`` patches each, a seeded
subset beyond that), and is compared with the ``auto`` norm outliers of the same tokens.
Tokens flagged with an LOF score >= :data:`STRONG` are "strong" anomalies: the top 5% exist in
every image, strong ones only where some tokens really sit apart.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import torch

from vitreg.analysis.base import Analysis, Finished
from vitreg.analysis.norms import NormsResult, norm_sites
from vitreg.core.renamed import renamed
from vitreg.hooks.reducers import Reducer, as_tokens
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, TraceResult
from vitreg.results.kinds import LOF, LOFAgreement

NEIGHBOURS = 30
CONTAMINATION = 0.05
STRONG = 1.5  # LOF score (ratio of local densities) that makes a flagged token a clear outlier
PRESENT_SHARE = 0.5  # anomalies are reported present when this share of images has strong ones
MIN_TOKENS = 8  # fewer patches per image: no density to compare
RULE = (
    f"per image, LocalOutlierFactor(n_neighbors={NEIGHBOURS}, contamination={CONTAMINATION}) on "
    "the penultimate block's patch tokens flags the top 5% (SC-CLIP, Bai et al. 2024); strong: "
    f"flagged with LOF score >= {STRONG}"
)


def lof_flags(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(flagged [n] bool, score [n])`` of SC-CLIP's LOF on the rows of ``x``."""
    from sklearn.neighbors import LocalOutlierFactor

    lof = LocalOutlierFactor(n_neighbors=min(NEIGHBOURS, len(x) - 1), contamination=CONTAMINATION)
    flagged = lof.fit_predict(x) == -1
    return flagged, -lof.negative_outlier_factor_


class KeptPatches(TypedDict):
    """The sampled patch tokens by image, in image order: (patch index ``[n]``, tokens ``[n, C]``)."""

    kept: dict[int, tuple[torch.Tensor, torch.Tensor]]


class PatchSample(Reducer[KeptPatches]):
    """The patch tokens ``[n, C]`` of the first ``max_images`` images, ``max_tokens`` at most."""

    def __init__(self, site: str, max_images: int, max_tokens: int, seed: int = 0) -> None:
        super().__init__(site)
        self.max_images, self.max_tokens, self.seed = max_images, max_tokens, seed
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # image -> (index, tokens)

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        x = as_tokens(t)
        patches = ctx.layout.take(x, "patches") if ctx.layout is not None else x
        n = patches.shape[1]
        index = torch.arange(n)
        if n > self.max_tokens:
            g = torch.Generator().manual_seed(self.seed)
            index = torch.randperm(n, generator=g)[: self.max_tokens].sort().values
        for i in range(min(x.shape[0], self.max_images - image_offset)):
            self.kept[image_offset + i] = (index, patches[i, index.to(x.device)].float().cpu())

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, PatchSample)
        self.kept.update(other.kept)
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> KeptPatches:
        return KeptPatches(kept=dict(sorted(self.kept.items())))


def agreement(flagged: torch.Tensor, auto: torch.Tensor) -> LOFAgreement:
    """Precision, recall and Jaccard of ``flagged`` against ``auto`` (both bool, same shape)."""
    both = int((flagged & auto).sum())
    nf, na, union = int(flagged.sum()), int(auto.sum()), int((flagged | auto).sum())
    return LOFAgreement(
        precision=both / nf if nf else None,
        recall=both / na if na else None,
        jaccard=both / union if union else None,
        auto_outliers=na,
        lof_flagged=nf,
    )


class LOFAnalysis(Analysis):
    """SC-CLIP's LOF anomaly tokens in the penultimate block, against the norm outliers."""

    name = "lof"

    def __init__(self, max_images: int = 16, max_tokens: int = 1024) -> None:
        self.max_images, self.max_tokens = max_images, max_tokens

    def not_applicable(self, model: Model) -> str | None:
        sites, _ = norm_sites(model)
        return None if len(sites) >= 2 else "LOF runs on the penultimate block; one block only"

    def reducers(self, model: Model) -> list[Reducer]:
        sites, _ = norm_sites(model)
        return [PatchSample(sites[-2], self.max_images, self.max_tokens)]

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> LOF:
        sample = trace.reducers[0]
        kept = sample.result()["kept"]
        norms = done.get("norms")
        auto = None
        if isinstance(norms, NormsResult) and sample.site in norms.trace.norms:
            auto = norms.masks(sample.site, "auto").flatten(1)
        grid = trace.layouts.get(sample.site) or model.layout
        h, w = grid.grid
        flags, autos, strong, scores, maps = [], [], [], [], []
        notes = []
        if any(len(t) < MIN_TOKENS for _, t in kept.values()):
            notes.append(f"images with fewer than {MIN_TOKENS} patches are skipped")
            kept = {i: v for i, v in kept.items() if len(v[1]) >= MIN_TOKENS}
        for image, (index, tokens) in kept.items():
            flagged, score = lof_flags(tokens.numpy())
            f = torch.from_numpy(flagged)
            flags.append(f)
            strong.append(int((f & torch.from_numpy(score >= STRONG)).sum()))
            scores.append(float(score.max()))
            cell = torch.full((h * w,), -1, dtype=torch.long)
            cell[index] = f.long()
            maps.append(cell.reshape(h, w).tolist())
            if auto is not None:
                autos.append(auto[image, index])
        n = len(kept)
        agree = agreement(torch.cat(flags), torch.cat(autos)) if autos else LOFAgreement()
        share = sum(s > 0 for s in strong) / max(n, 1)
        return LOF(
            present=share >= PRESENT_SHARE,
            rule=RULE,
            site=sample.site,
            n_images=n,
            flagged_rate=float(torch.cat(flags).float().mean()) if flags else 0.0,
            strong_per_image=sum(strong) / max(n, 1),
            strong_image_share=share,
            max_score=max(scores, default=0.0),
            agreement_with_auto=agree,
            maps=maps,
            notes=notes + ([] if autos else ["no auto outliers to compare with (no norm results)"]),
        )


__getattr__ = renamed(__name__, {"LOFResult": "LOF"}, globals())
