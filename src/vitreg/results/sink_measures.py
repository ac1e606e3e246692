"""The sink measures beside the Section-4 events (:class:`vitreg.results.kinds.Sinks` holds them):
the column-sum concentration ratio, the counts of Fesser et al.'s tables and of their Definition 1
with the reference's own head selection, and the sink-vs-random masking control."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vitreg.results.base import ResultsModel


class SinkConcentration(ResultsModel):
    """``r = max_j c_j / median_j c_j`` of the column sums ``c_j = sum_i A_ij`` per block and head."""

    rule: str
    blocks: list[int]
    mean: list[list[float]] = Field(description="[block][head]: mean of r over the images")
    max: list[list[float]] = Field(description="[block][head]: largest r of any image")
    peak_block: int
    peak_head: int
    peak: float = Field(description="the largest mean r of any head")


class KeyCounts(ResultsModel):
    """Events per image, all and by the type of the key they land on."""

    total: float = 0.0
    on_cls: float = 0.0
    on_register: float = 0.0
    on_extra: float = 0.0
    on_patch: float = 0.0


class ClassCounts(ResultsModel):
    """Events per image of one rule: all, broadcast-like and NOP-like."""

    events: KeyCounts
    broadcast: KeyCounts
    nop: KeyCounts


class RuleCounts(ResultsModel):
    """The counts of one event rule, blocks >= 1 (as the paper's tables) and block 0 apart."""

    name: Literal["relaxed", "definition1"]
    eps: float | None = Field(description="Definition 1's epsilon (None: the relaxed rule)")
    rule: str
    from_block1: ClassCounts
    block0: ClassCounts


class ReferenceHead(ResultsModel):
    """A head the reference's selection names: its events of the class and its event rate."""

    block: int
    head: int
    n_events: int
    event_rate: float = Field(description="share of images with an event of any class")


class ReferenceHeads(ResultsModel):
    """Per class, the heads with at least ``min_events`` events of that class (Section-4 rule),
    ranked by count: the top ``k_deep`` of blocks >= 1 and the top ``k_block0`` of block 0."""

    rule: str
    min_events: int
    k_deep: int
    k_block0: int
    nop: list[ReferenceHead]
    broadcast: list[ReferenceHead]
    nop_block0: list[ReferenceHead]
    broadcast_block0: list[ReferenceHead]


class SinkReferenceCounts(ResultsModel):
    """Sink counts as KempnerInstitute/attention_sink counts them (its tables' rule, Definition 1
    for each epsilon, its head selection), block 0 apart."""

    classes_by: str
    nop_ratio: float
    broadcast_ratio: float
    rules: list[RuleCounts]
    heads: ReferenceHeads


class Interval(ResultsModel):
    """A mean over images and its 95% bootstrap interval."""

    mean: float
    low: float
    high: float


class PathControl(ResultsModel):
    """One edit path: the relative change of the final features with the sink keys edited, with as
    many random keys edited, and their paired difference (sink minus random)."""

    sink: Interval
    random: Interval
    difference: Interval
    ratio: float | None = Field(description="mean sink change / mean random change")


class SinkControl(ResultsModel):
    """The sink-vs-random masking control (Wu & Summa, ICML 2026) on the sink heads."""

    method: str
    measure: str
    n_images: int
    heads: list[list[int]] = Field(description="[block, head] of each edited head")
    keys_per_head: int
    seed: int
    score: PathControl | None = Field(description="score path (None: no head to edit)")
    value: PathControl | None = Field(description="value path (None: no head to edit)")
    notes: list[str]
