"""``vitreg diagnose`` results: one model per analysis (norms, attention, redundancy,
LayerNorm separation, feature pictures), as the analyses of :mod:`vitreg.analysis` build them.
Every statistic that has
nothing to summarise (no outlier patch, no interval, a block without a pattern) is ``None`` here,
so a renderer sees it in the type, not in a crash."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from vitreg.results.base import ResultsModel
from vitreg.results.kinds import LOF, Kinds, Massive, Positions, Registers, Sinks


class Quantiles(ResultsModel):
    """Patch-token norm quantiles at one site."""

    p1: float
    p25: float
    p50: float
    p75: float
    p98: float
    p99: float
    max: float


class Bimodal(ResultsModel):
    """The two-Gaussian fit of log10 patch norms (``None``: infinite or undefined)."""

    present: bool
    threshold: float | None = Field(description="in norm units; None when no outlier mode")
    low_mean: float | None
    high_mean: float | None
    low_std: float | None
    high_std: float | None
    high_weight: float | None
    ashman_d: float | None
    bic_gain: float | None
    mode_ratio: float | None

    @property
    def cut(self) -> float:
        """The threshold as a number: infinite (flags nothing) when there is no outlier mode."""
        return self.threshold if self.threshold is not None else math.inf


class SiteNorms(ResultsModel):
    """Outlier statistics of patch tokens at one site, by every rule."""

    site: str
    layer: int | None
    quantiles: Quantiles
    mean_norm_by_type: dict[str, float] = Field(description="token group -> mean norm")
    bimodal: Bimodal
    thresholds: dict[str, float | None] = Field(description="rule -> threshold (None: none)")
    outlier_rate: dict[str, float] = Field(description="rule -> share of patch tokens flagged")
    artifacts_present: bool
    p98_over_median: float
    max_over_median: float

    def cut(self, rule: str) -> float:
        """The threshold of ``rule`` as a number: infinite (flags nothing) where there is none."""
        value = self.thresholds[rule]
        return value if value is not None else math.inf


class Evidence(ResultsModel):
    """Why the verdict is what it is: the strongest outlier layer and its mode."""

    layers_with_outlier_mode: list[int]
    strongest_layer: int | None
    mode_ratio: float | None
    ashman_d: float | None
    outlier_rate: float
    after_final_norm_present: bool | None
    criteria: str


class Norms(ResultsModel):
    """Per-layer outlier statistics, the post-final-norm view, emergence and verdict."""

    n_images: int
    verdict: Literal["artifacts", "no artifacts"]
    artifacts_present: bool
    emergence_layer: int | None
    evidence: Evidence
    rules: dict[str, dict[str, float]] = Field(description="rule -> its parameters")
    layers: list[SiteNorms]
    after_final_norm: SiteNorms | None


class Agreement(ResultsModel):
    """Attention artifacts vs norm outliers at one block; ``reason`` when not computed."""

    norm_site: str
    norm_method: str | None
    precision: float | None = None
    recall: float | None = None
    iou: float | None = None
    overlap: float | None = None
    n_attention: int | None = None
    n_norm: int | None = None
    n_both: int | None = None
    top_p_iou: float | None = None
    top_p: float | None = None
    reason: str | None = None


class AttentionSummary(ResultsModel):
    """The numbers of the last attention layer."""

    layer: int | None
    site: str
    sink_mass: dict[str, float] = Field(description="k -> mass of the top-k keys")
    entropy: float
    cls_to_patch_max: float
    artifact_rate: float
    agreement: Agreement


class Attention(ResultsModel):
    """Attention maps, sinks and attention/norm agreement per layer (forward order)."""

    query: str
    definitions: dict[str, str]
    attention_source: str | list[str]
    norm_method: str | None
    summary: AttentionSummary
    sites: list[str]
    layers: list[int | None]
    map_grid: list[list[int]]
    n_keys: list[int]
    sink_mass: dict[str, list[float]] = Field(description="k -> per-layer top-k key mass")
    entropy: list[float]
    entropy_normalized: list[float | None]
    cls_to_patch_max: list[float]
    artifact_rate: list[float]
    agreement: list[Agreement]
    notes: list[str]


class Spread(ResultsModel):
    """A redundancy distribution: count, mean, median and quantiles."""

    n: int
    mean: float
    median: float
    p10: float
    p25: float
    p75: float
    p90: float


class Placement(ResultsModel):
    """Outliers vs normal patches on one redundancy measure (``None``: no patch of that kind)."""

    outlier: Spread | None
    normal: Spread | None
    auc: float | None


class RateBin(ResultsModel):
    """One redundancy bin: its edges, size and outlier rate (``None``: empty bin)."""

    lo: float
    hi: float
    n: int
    mean_redundancy: float | None
    outlier_rate: float | None


class RateCurve(ResultsModel):
    """Outlier rate per quantile bin of one redundancy measure."""

    measure: str
    binning: str
    bins: list[RateBin]


class Border(ResultsModel):
    """Outlier rate on the outermost ring of patches vs inside."""

    definition: str
    n_border: int
    n_interior: int
    outlier_rate_border: float | None
    outlier_rate_interior: float | None
    border_over_interior: float | None


class Background(ResultsModel):
    """Outlier rate in the most redundant (background) patches vs elsewhere."""

    definition: str
    threshold: float | None
    fraction: float
    outlier_rate_background: float | None
    outlier_rate_foreground: float | None
    outlier_share_in_background: float


class Redundancy(ResultsModel):
    """Local redundancy at the embedding and one block output, and where outliers sit."""

    embed_site: str
    layer_site: str
    layer: int
    embed_grid: list[int]
    layer_grid: list[int]
    measure: str
    outlier_method: str
    outlier_method_reason: str
    n_outliers: int
    outlier_rate: float
    note: str | None
    outlier_vs_normal: dict[str, Placement] = Field(description="measure -> placement")
    rate_by_redundancy: RateCurve
    border: Border
    background: Background


class Similarity(ResultsModel):
    """Mean cosine similarity of one token pair over images."""

    mean: float
    std: float
    n: int


class LNSeparation(ResultsModel):
    """Per block: [CLS]/register/patch similarity around each norm, channel ownership."""

    similarity: list[dict[str, dict[str, Similarity]]] = Field(
        description="per block: probe point (pre_ln1, post_ln1, ...) -> token pair -> similarity"
    )
    owned_channel_fraction: list[float | None]
    ln1_gain_owned_over_other: list[float | None]
    owned_threshold: str
    has_cls: bool
    has_registers: bool


class PCA(ResultsModel):
    """The share of variance of the first principal components, over how many patches."""

    explained_variance: list[float]
    n_patches: int


class SitePicture(ResultsModel):
    """PCA colours and centre-patch similarity at one site."""

    site: str
    where: str
    n_images_shown: int
    query_patch: list[int]
    pca: PCA


class FeaturePictures(ResultsModel):
    """Feature pictures by site, and the sites left out with why."""

    sites: list[SitePicture]
    skipped: dict[str, str] = Field(default_factory=dict)


class DiagnoseResults(ResultsModel):
    """``vitreg diagnose``: one block per analysis (``None``: it did not run or apply, said in
    ``not_applicable``)."""

    norms: Norms
    attention: Attention | None = None
    redundancy: Redundancy | None = None
    ln_separation: LNSeparation | None = None
    feature_pictures: FeaturePictures | None = None
    # the per-kind analyses (vitreg.results.kinds)
    kinds: Kinds | None = None
    sinks: Sinks | None = None
    massive: Massive | None = None
    lof: LOF | None = None
    positions: Positions | None = None
    registers: Registers | None = None
    not_applicable: dict[str, str] = Field(default_factory=dict)
    attention_source: str | list[str] | None = None
