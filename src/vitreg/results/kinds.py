"""``vitreg diagnose`` results of the per-kind analyses: the per-kind verdict, attention sinks,
massive activations, LOF anomaly tokens, position-tied artifacts and register tokens, as
:mod:`vitreg.analysis.kinds`, ``sinks``, ``massive``, ``anomaly_lof``, ``positions`` and
``registers`` build them. Event counts a run did not see are 0, statistics of nothing
``None``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vitreg.results.base import ResultsModel
from vitreg.results.sink_measures import SinkConcentration, SinkControl, SinkReferenceCounts

Cell = list[int]  # [row, col] of a patch position


# sinks (vitreg.analysis.sinks) ----------------------------------------------------------------
class SinkCounts(ResultsModel):
    """Sink events per image: all, by class and by the type of the key they land on."""

    total: float = 0.0
    nop: float = 0.0
    broadcast: float = 0.0
    other: float = 0.0
    on_cls: float = 0.0
    on_register: float = 0.0
    on_extra: float = 0.0
    on_patch: float = 0.0


class SinkBlock(SinkCounts):
    """Sink events per image at one block."""

    block: int


class SinkHeadRow(ResultsModel):
    """A head with sink events in at least ``head_rate_threshold`` of the images."""

    block: int
    head: int
    rate: float = Field(description="share of images with an event")
    kind: Literal["nop", "broadcast", "other"] = Field(description="majority class")
    key_type: Literal["cls", "register", "extra", "patch"] = Field(description="majority key")
    key_position: Cell | None = Field(description="[row, col] of a patch key (else None)")
    ratio: float = Field(description="median value-norm ratio of the sink key over its events")
    stable_rank: float = Field(description="median stable rank of the head update")


class Sinks(ResultsModel):
    """Sink events of every block and head (Fesser et al. 2026)."""

    present: bool = Field(
        description="vitreg's own rule: some head (block 0 included) has a Section-4 event in "
        "at least head_rate_threshold of the images"
    )
    rule: str
    n_images: int
    n_heads: int
    head_rate_threshold: float
    per_image: SinkCounts
    per_image_from_block1: SinkCounts = Field(
        description="blocks >= 1 with the Section-4 classes (the paper's tables count with "
        "reference_counts' rule instead)"
    )
    blocks: list[SinkBlock]
    heads: list[SinkHeadRow]
    transition_block: int | None = Field(description="where sinks move from [CLS] to patches")
    register_share: float | None = Field(description="share of events on registers (None: none)")
    patch_map: list[list[float]] = Field(description="events per image on each patch position")
    notes: list[str]
    concentration: SinkConcentration | None = None
    reference_counts: SinkReferenceCounts | None = None
    control: SinkControl | None = None


# massive activations (vitreg.analysis.massive) ------------------------------------------------
class MassiveBlock(ResultsModel):
    """Massive entries at one block output."""

    block: int
    median_abs: float = Field(description="median over images of the median |activation|")
    entries_per_image: float
    channels: list[int]


class MassiveChannelRow(ResultsModel):
    """One channel carrying massive activations."""

    channel: int
    blocks: list[int]
    hits_per_image: float = Field(description="massive entries per image, summed over blocks")
    max_value: float
    max_over_median: float
    token_types: dict[str, int] = Field(description="token type -> massive entries on it")
    top_tokens: list[int] = Field(description="most frequent token indices")
    high_norm_share: float = Field(description="share on high-norm tokens (NaN: no norms)")


class Massive(ResultsModel):
    """Massive activations per block and channel, and their overlap with high-norm tokens."""

    present: bool
    rule: str
    n_images: int
    first_block: int | None
    blocks: list[MassiveBlock]
    channels: list[MassiveChannelRow]
    on_high_norm_tokens: float | None
    auto_outliers_with_massive: float | None
    high_norm_rule: str
    notes: list[str]


# LOF anomaly tokens (vitreg.analysis.anomaly_lof) ---------------------------------------------
class LOFAgreement(ResultsModel):
    """LOF flags against the auto norm outliers of the same tokens (all None: no norm results)."""

    precision: float | None = None
    recall: float | None = None
    jaccard: float | None = None
    auto_outliers: int | None = None
    lof_flagged: int | None = None


class LOF(ResultsModel):
    """SC-CLIP's LOF anomaly tokens in the penultimate block."""

    present: bool
    rule: str
    site: str
    n_images: int
    flagged_rate: float
    strong_per_image: float
    strong_image_share: float
    max_score: float
    agreement_with_auto: LOFAgreement
    maps: list[list[list[int]]] = Field(
        description="per sampled image, the patch grid: 1 flagged, 0 not, -1 not sampled"
    )
    notes: list[str]


# position-tied artifacts (vitreg.analysis.positions) ------------------------------------------
class PositionEmbedding(ResultsModel):
    """Norm per patch position of the learned position embedding."""

    norm_map: list[list[float]]
    median: float
    max_over_median: float
    high_positions: list[Cell]
    top_channel_share_of_high: float | None


class Positions(ResultsModel):
    """Per-position outlier statistics, position-embedding norms and constant-image responses."""

    present: bool
    rule: str
    n_images: int
    block: int | None
    positions: list[Cell] = Field(description="consistent outlier positions at that block")
    consistency_score: float
    rate_map: list[list[float]]
    constant_images: dict[str, list[Cell]] = Field(
        description="constant image (grey, zero) -> its high positions at that block"
    )
    position_embedding: PositionEmbedding | None
    attention_consistent_positions: list[Cell]
    notes: list[str]


# register tokens (vitreg.analysis.registers) --------------------------------------------------
class RegisterBlock(ResultsModel):
    """Median token norm per group at one block output, and the attention each group receives."""

    block: int
    cls_norm: float | None = None
    register_norm: float | None = None
    extra_norm: float | None = None
    patch_norm: float
    register_over_patch: float | None
    attention_share: dict[str, float] = Field(description="token type -> mean attention received")


class Registers(ResultsModel):
    """Register tokens (trained and inserted) as a group, and whether they absorbed artifacts."""

    n_registers: int
    n_extra: int
    absorbed: bool | None = Field(description="None: the model has no register tokens")
    why: str
    sink_share: float | None
    massive_share: float | None
    register_over_patch_norm_max: float | None
    rule: str
    blocks: list[RegisterBlock]


# the per-kind verdict (vitreg.analysis.kinds) -------------------------------------------------
class HighNormEvidence(ResultsModel):
    """The norm verdict's evidence, with the position-consistency score when outliers exist."""

    layers_with_outlier_mode: list[int]
    strongest_layer: int | None
    mode_ratio: float | None
    ashman_d: float | None
    outlier_rate: float
    after_final_norm_present: bool | None
    criteria: str
    position_consistency: float | None = None


class AttentionEvidence(ResultsModel):
    """The last attention layer's artifact rate and its agreement with the norm outliers."""

    last_layer_artifact_rate: float
    presence_rate: float
    agreement_with_norms: dict[str, str | int | float | None] = Field(
        description="the attention block's summary.agreement"
    )


class SinkEvidence(ResultsModel):
    """NOP or broadcast sinks: events per image of that class and its sink heads."""

    per_image: float
    heads: list[SinkHeadRow]
    transition_block: int | None


class PositionEvidence(ResultsModel):
    """Position-tied artifacts: the block, its consistency score, the constant-image positions."""

    block: int | None
    consistency_score: float
    constant_images: dict[str, list[Cell]]
    pos_embed_max_over_median: float | None


class MassiveEvidence(ResultsModel):
    """Massive activations: first block, overlap with high-norm tokens, top 3 channels."""

    first_block: int | None
    on_high_norm_tokens: float | None
    channels: list[MassiveChannelRow]


class LOFEvidence(ResultsModel):
    """LOF anomaly tokens: strong anomalies and agreement with the auto outliers."""

    strong_per_image: float
    strong_image_share: float
    max_score: float
    agreement_with_auto: LOFAgreement


class RegisterEvidence(ResultsModel):
    """The register result without its per-block rows."""

    n_registers: int
    n_extra: int
    absorbed: bool | None
    why: str
    sink_share: float | None
    massive_share: float | None
    register_over_patch_norm_max: float | None
    rule: str


class NoEvidence(ResultsModel):
    """A kind that was not analysed: no evidence."""


KindEvidence = (
    HighNormEvidence
    | AttentionEvidence
    | SinkEvidence
    | PositionEvidence
    | MassiveEvidence
    | LOFEvidence
    | RegisterEvidence
    | NoEvidence
)
KindName = Literal[
    "high-norm outliers",
    "attention artifacts",
    "NOP sinks",
    "broadcast sinks",
    "position-tied",
    "massive activations",
    "LOF anomaly tokens",
    "registers absorbed the artifacts",
]


class KindRow(ResultsModel):
    """One kind: present (None: not analysed), where, its evidence and the source of its rule."""

    kind: KindName
    present: bool | None
    where: str
    evidence: KindEvidence = Field(description="the evidence model of this kind ({}: not analysed)")
    source: str


class Kinds(ResultsModel):
    """Every kind of token artifact, in the report's order, and the names of those present."""

    present: list[KindName]
    kinds: list[KindRow]

    def row(self, kind: str) -> KindRow:
        """The row of ``kind`` (a :data:`KindName`)."""
        found = next((k for k in self.kinds if k.kind == kind), None)
        if found is None:
            raise KeyError(f"no kind {kind!r}; the kinds are {[k.kind for k in self.kinds]}")
        return found
