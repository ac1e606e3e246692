"""``vitreg probe`` results: per condition (base, fixed) and layer, each task's scores over
seeds with the task's yardsticks, the fixed − base differences with their verdicts, and the
data sets, feature caches, task details and fix (a field a task or data set does not write is
left out of the file)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from vitreg.results.base import OpenResults, ResultsModel, SparseResults
from vitreg.results.diagnose import Bimodal
from vitreg.results.fix import FixDescription
from vitreg.settings.ov_seg import OvSegSettings, ProtocolName

Verdict = Literal["better", "worse", "within noise", "no interval"]


class ProbeYardstick(ResultsModel):
    """A trivial baseline of one probe metric (chance, majority class, mean depth, ...)."""

    name: str
    metric: str
    group: str = "all"
    value: float | None
    description: str


class ProbeScore(ResultsModel):
    """One metric of one feature (and token group) over seeds, with its 95% half-width."""

    feature: str
    group: str
    metric: str
    mean: float | None
    ci95: float | None
    values: list[float | None]
    higher_is_better: bool
    n_test: int
    lrs: list[float]
    vs_yardsticks: dict[str, Verdict] = Field(
        default_factory=dict, description="yardstick name -> the score's verdict against it"
    )


class ClassIoU(ResultsModel):
    """Segmentation: one class's IoU (mean over seeds; None when absent from prediction and
    target) and its test pixels."""

    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    class_: int = Field(alias="class")
    iou: float | None
    test_pixels: int


class SplitCounts(ResultsModel):
    """How many train and test images one token view kept."""

    train: int
    test: int


class OvSegProtocolRecord(SparseResults):
    """Which protocol set an ov-seg condition's settings: the settings it ran with, where they
    are published, and what of them this model could not take."""

    protocol: ProtocolName
    benchmark: str
    method: str | None = Field(None, description="whose published settings ran; None: shared")
    source: str | None = Field(None, description="repo@commit path:lines of the settings")
    commit: str | None = Field(None, description="the repository commit they were read at")
    attention: str | None = Field(None, description="the attention the shipped evaluation runs")
    settings: OvSegSettings = Field(description="the settings the condition ran with")
    deviations: list[str] = Field(
        default_factory=list, description="published settings this model could not take"
    )
    note: str | None = None


class TaskInfo(OpenResults):
    """A task's details at one layer; each task writes its own fields, the rest are left out."""

    num_classes: int | None = Field(None, description="classification, segmentation, ...")
    majority_rate: float | None = Field(None, description="classification")
    ignored_test_pixels: int | None = Field(None, description="segmentation")
    per_class: list[ClassIoU] | None = Field(None, description="segmentation")
    max_depth: float | None = Field(None, description="depth")
    mean_depth: float | None = Field(None, description="depth")
    invalid_test_pixels: int | None = Field(None, description="depth")
    outlier_threshold: float | None = Field(None, description="token-type, position, ...")
    bimodal_fit: Bimodal | None = Field(None, description="token-type, position, ...")
    tokens: dict[str, int] | None = Field(None, description="token group -> test tokens")
    train_tokens: int | None = Field(None, description="position, reconstruction")
    images: dict[str, SplitCounts] | None = Field(None, description="token-type: per view")
    map_images: int | None = Field(None, description="attention-seg")
    map_skipped: int | None = Field(None, description="attention-seg")
    foreground_fraction: float | None = Field(None, description="attention-seg")
    threshold: str | None = Field(None, description="attention-seg")
    biases: list[float] | None = Field(None, description="object-discovery")
    prompts_per_class: int | None = Field(None, description="ov-seg")
    templates: int | None = Field(None, description="zero-shot")
    templates_source: str | None = Field(None, description="zero-shot")
    logit_scale: float | None = Field(None, description="zero-shot, ov-seg")
    clip: str | None = Field(None, description="zero-shot")
    class_embeddings: str | None = Field(None, description="zero-shot")
    prob_thd: float | None = Field(None, description="ov-seg")
    area_thd: float | None = Field(None, description="ov-seg")
    short_side: int | None = Field(None, description="ov-seg")
    crop: list[int] | None = Field(None, description="ov-seg")
    pamr_steps: int | None = Field(None, description="ov-seg")
    pamr_dilations: list[int] | None = Field(None, description="ov-seg")
    protocol: OvSegProtocolRecord | None = Field(None, description="ov-seg --protocol published")
    keep_ratios: list[float] | None = Field(None, description="pruning")
    kept_tokens: list[int] | None = Field(None, description="pruning: patches kept per ratio")
    patches: int | None = Field(None, description="pruning")
    sink_mu: float | None = Field(None, description="pruning: SToP's mu_s")
    sink_gamma: float | None = Field(None, description="pruning: SToP's gamma")


class DataSetRecord(OpenResults):
    """One split's data set as it describes itself, with the samples the extraction skipped
    and the pixels it repaired (``log``) and the files its listing passed over."""

    spec: str | None = None
    name: str | None = None
    split: str | None = None
    n: int | None = None
    targets: list[str] | None = None
    num_classes: int | None = None
    fingerprint: str | None = None
    warnings: list[str] | None = None
    params: dict[str, int] | None = Field(None, description="a synthetic set's parameters")
    log: dict[str, int] | None = Field(None, description="reason -> samples or pixels")
    listing: dict[str, int] | None = Field(None, description="reason -> files not read")


class ProbeData(ResultsModel):
    """The train and test data sets."""

    train: DataSetRecord
    test: DataSetRecord


class FeatureCache(SparseResults):
    """The features of one condition and split: where they are cached, how many, the forward
    passes this run ran (0: reused), and samples skipped, pixels repaired and shards replaced
    by reason."""

    folder: str | None
    n: int
    forward_passes: int
    skipped: dict[str, int]
    repairs: dict[str, int] | None = None
    replaced: dict[str, int] | None = None


class ProbeLayer(ResultsModel):
    """Every score of one task at one layer, its yardsticks, notes and task details."""

    task: str
    layer: str
    scores: list[ProbeScore]
    notes: list[str]
    info: TaskInfo = Field(description="the task's details (classes, ranges, ...)")
    yardsticks: list[ProbeYardstick]


class ProbeDelta(ResultsModel):
    """fixed − base of one score, called better/worse only when the 95% intervals separate."""

    layer: str
    feature: str
    group: str
    metric: str
    delta: float
    verdict: Verdict


class ProbeResults(ResultsModel):
    """``vitreg probe``: scores per condition and layer, and the fixed − base differences."""

    task: str
    description: str = ""
    seeds: list[int] | int
    layers: list[str]
    data: ProbeData
    conditions: dict[str, list[ProbeLayer]] = Field(description="condition -> per layer")
    deltas: list[ProbeDelta] = Field(default_factory=list)
    caches: dict[str, FeatureCache] = Field(
        default_factory=dict, description="condition/split -> its feature cache"
    )
    fix: FixDescription | None = None
