"""Pictures of the patch features themselves: the first three PCA components as RGB, and the
cosine similarity of one patch to all others (the figures DINOv2 users look at first).

Streaming: every patch of every image adds to a running sum and Gram matrix (``C x C`` in float64,
8 MB for C = 1024), so the PCA is fitted on all images of the run; only the first ``keep``
images' features are kept for the pictures. The query patch of the similarity map is the centre
patch (row ``h // 2``, column ``w // 2``), the same in every image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import torch
import torch.nn.functional as F

from vitreg.analysis.base import Analysis, Finished, Traced
from vitreg.analysis.norms import norm_sites
from vitreg.core.renamed import renamed
from vitreg.errors import HookError
from vitreg.hooks.reducers import Reducer
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, TraceResult
from vitreg.results import diagnose as typed
from vitreg.results.diagnose import PCA, SitePicture

N_COMPONENTS = 3
RGB_CLIP = (1.0, 99.0)  # percentiles of each component mapped to 0 and 1


class FeatureStats(TypedDict):
    """Mean ``[C]`` and covariance ``[C, C]`` (float64) of the ``count`` patches of a run, and
    the features ``[n, h, w, C]`` of the first images."""

    mean: torch.Tensor
    cov: torch.Tensor
    count: int
    features: torch.Tensor


class PatchFeatures(Reducer[FeatureStats]):
    """Running mean and Gram matrix of all patch features at one site, and the features
    ``[n, h, w, C]`` of the first ``keep`` images."""

    def __init__(self, site: str, keep: int = 4) -> None:
        super().__init__(site)
        self.keep = keep
        self.total: torch.Tensor | None = None
        self.gram: torch.Tensor | None = None
        self.count = 0
        self.kept: dict[int, torch.Tensor] = {}

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        if t.dim() != 4 and ctx.layout is None:
            return  # no patch grid here: result() says so and the site is left out
        grid = (t if t.dim() == 4 else ctx.layout.patch_grid(t)).float()
        flat = grid.reshape(-1, grid.shape[-1]).double()
        total, gram = flat.sum(0).cpu(), (flat.T @ flat).cpu()
        self.total = total if self.total is None else self.total + total
        self.gram = gram if self.gram is None else self.gram + gram
        self.count += flat.shape[0]
        for i in range(min(grid.shape[0], max(0, self.keep - image_offset))):
            self.kept[image_offset + i] = grid[i].cpu()

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, PatchFeatures)
        if other.total is not None:
            self.total = other.total if self.total is None else self.total + other.total
            self.gram = other.gram if self.gram is None else self.gram + other.gram
            self.count += other.count
        self.kept.update(other.kept)
        self.kept = {k: self.kept[k] for k in sorted(self.kept)[: self.keep]}
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> FeatureStats:
        if self.total is None:
            raise HookError(f"{self.site!r} gave no patch grid (no token layout there)")
        mean = self.total / self.count
        cov = self.gram / self.count - torch.outer(mean, mean)
        kept = torch.stack([self.kept[k] for k in sorted(self.kept)])
        return FeatureStats(mean=mean, cov=cov, count=self.count, features=kept)


@dataclass
class PCABasis:
    """The first principal axes of the patch features of a run (rows of ``components``), and
    ``pca``: the share of the variance each explains and how many patches they were fitted on."""

    mean: torch.Tensor  # [C] float64
    components: torch.Tensor  # [k, C] float64, unit rows
    pca: PCA
    lo: torch.Tensor | None = None  # [k] colour range of each component (set by fit_colours)
    hi: torch.Tensor | None = None

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """``[..., C]`` features onto the components: ``[..., k]``."""
        return (features.double() - self.mean) @ self.components.T

    def fit_colours(self, features: torch.Tensor) -> PCABasis:
        """Fix each component's colour range from the RGB_CLIP percentiles of ``features``."""
        p = self.project(features).reshape(-1, self.components.shape[0]).numpy()
        lo, hi = np.percentile(p, RGB_CLIP, axis=0)
        self.lo, self.hi = torch.from_numpy(lo), torch.from_numpy(np.maximum(hi, lo + 1e-12))
        return self

    def rgb(self, features: torch.Tensor) -> np.ndarray:
        """``[n, h, w, 3]`` colours in [0, 1]: component i -> channel i, clipped to its range."""
        if self.lo is None or self.hi is None:
            self.fit_colours(features)
        p = (self.project(features) - self.lo) / (self.hi - self.lo)
        return p.clamp(0, 1).float().numpy()

    @property
    def explained(self) -> list[float]:
        """The share of the total variance of each component."""
        return self.pca.explained_variance

    @property
    def n_patches(self) -> int:
        """How many patch tokens the components were fitted on."""
        return self.pca.n_patches


def pca_basis(stats: FeatureStats, k: int = N_COMPONENTS) -> PCABasis:
    """The top-``k`` eigenvectors of the streamed covariance (signs fixed: largest loading > 0)."""
    values, vectors = torch.linalg.eigh(stats["cov"])
    order = values.flip(0)[:k].clamp_min(0)
    # layout: eigenvector columns, not tokens
    comps = vectors.flip(1)[:, :k].T.contiguous()
    signs = torch.sign(comps.gather(1, comps.abs().argmax(1, keepdim=True)))
    comps = comps * torch.where(signs == 0, 1.0, signs)
    total = float(values.clamp_min(0).sum()) or 1.0
    pca = PCA(explained_variance=[float(v) / total for v in order], n_patches=stats["count"])
    return PCABasis(stats["mean"], comps, pca)


def query_patch(h: int, w: int) -> tuple[int, int]:
    """The similarity map's query: the centre patch."""
    return h // 2, w // 2


def similarity_maps(features: torch.Tensor) -> torch.Tensor:
    """``[n, h, w]`` cosine similarity of each image's centre patch to every patch."""
    n, h, w, c = features.shape
    r, q = query_patch(h, w)
    unit = F.normalize(features.float(), dim=-1)
    return torch.einsum("nhwc,nc->nhw", unit, unit[:, r, q])


@dataclass
class SiteFeatures(Traced):
    """The patch features of the first images of a run at one site and their PCA basis (for
    PCA colours and centre-patch similarity)."""

    features: torch.Tensor  # [n, h, w, C] of the kept images
    basis: PCABasis
    summary: SitePicture

    @property
    def query(self) -> tuple[int, int]:
        return query_patch(*self.features.shape[1:3])

    @property
    def similarity(self) -> torch.Tensor:
        """``[n, h, w]`` cosine similarity of each kept image's centre patch to every patch."""
        return similarity_maps(self.features)


def site_features(site: str, stats: FeatureStats) -> SiteFeatures:
    """The kept features of ``site`` with the PCA basis of all its patches (``stats``: a
    :class:`PatchFeatures` result)."""
    features = stats["features"]
    basis = pca_basis(stats).fit_colours(features)
    where = "after the final norm" if site.startswith("ln_final") else "residual stream"
    summary = SitePicture(
        site=site,
        where=where,
        n_images_shown=int(features.shape[0]),
        query_patch=list(query_patch(*features.shape[1:3])),
        pca=basis.pca,
    )
    return SiteFeatures(features, basis, summary)


class FeaturePictureAnalysis(Analysis):
    """Feature pictures at one block output (default: the last, as the redundancy analysis) and
    after the final norm."""

    name = "feature_pictures"

    def __init__(self, keep: int = 4, layer: int | None = None) -> None:
        self.keep = keep
        self.layer = layer

    def sites(self, model: Model) -> list[str]:
        blocks, final = norm_sites(model)
        if not blocks:
            return []
        layer = len(blocks) - 1 if self.layer is None else self.layer
        return [blocks[layer], *([final] if final else [])]

    def not_applicable(self, model: Model) -> str | None:
        return None if self.sites(model) else "the model exposes no block outputs"

    def reducers(self, model: Model) -> list[Reducer]:
        return [PatchFeatures(site, self.keep) for site in self.sites(model)]

    def finish(
        self, model: Model, trace: TraceResult, done: dict[str, Finished]
    ) -> FeaturePicturesResult:
        out, skipped = {}, {}
        for reducer in trace.reducers:
            try:
                stats = reducer.result()
            except HookError as e:
                skipped[reducer.site] = str(e)
                continue
            out[reducer.site] = site_features(reducer.site, stats)
        summary = typed.FeaturePictures(sites=[p.summary for p in out.values()], skipped=skipped)
        return FeaturePicturesResult(out, summary)


@dataclass
class FeaturePicturesResult(Traced):
    """Feature pictures by site, in forward order, and their summary (with the sites left out)."""

    by_site: dict[str, SiteFeatures]
    summary: typed.FeaturePictures


__getattr__ = renamed(__name__, {"FeaturePictures": "SiteFeatures"}, globals())
