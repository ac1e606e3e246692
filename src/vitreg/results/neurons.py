"""``vitreg neurons`` results: the chosen register neurons, how detection, the causal
selection and the top-k calibration chose them, and what the fix leaves on held-out images."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from vitreg.core.choices import MASK_RULES
from vitreg.results.base import OpenResults, ResultsModel, as_setting


class NeuronRow(ResultsModel):
    """One neuron: block, MLP unit, discovery score, and its causal effects when measured."""

    layer: int
    unit: int
    score: float
    effect_alone: float | None = None
    effect_in_set: float | None = None
    effect_alone_at_emergence: float | None = None
    persistence: float | None = None


class LayerCount(ResultsModel):
    """How many chosen neurons one block holds."""

    layer: int
    n_neurons: int


class SurveyRow(ResultsModel):
    """One block of the detection survey: whether its patch norms have an outlier mode."""

    layer: int | None
    outlier_mode: bool
    ashman_d: float | None
    mode_ratio: float | None
    max_over_median: float


class HeldOut(ResultsModel):
    """The fix at the chosen k on held-out images: before and after."""

    n_images: int
    k: int
    outlier_rate_before: float
    max_patch_norm_before: float
    median_patch_norm_before: float
    max_over_median_before: float
    blocks_with_outlier_mode_before: list[int]
    outlier_rate_after: float
    max_patch_norm_after: float
    median_patch_norm_after: float
    max_over_median_after: float
    blocks_with_outlier_mode_after: list[int]
    ordinary_max_over_median: float


class CausalBaseline(ResultsModel):
    """The outlier excess with nothing zeroed, at the detection block and every block."""

    threshold: str
    threshold_value: float | None
    median_patch_norm: float
    n_outlier_patches: int
    ordinary_excess: float
    excess: float
    excess_by_block: dict[str, float] = Field(description="block -> outlier excess")


class UnitEffect(ResultsModel):
    """One unit's measured effect on the outlier excess (fractions of the baseline); for a
    dropped unit, its kind and why it was dropped."""

    layer: int
    unit: int
    alone: float | None = None
    alone_at_emergence: float | None = None
    in_set: float | None = None
    in_set_at_emergence: float | None = None
    alone_most: float | None = Field(
        None, description="the largest fall of the excess at any block, zeroing it alone"
    )
    in_set_most: float | None = Field(
        None, description="the largest excess it brings back at any block, restored alone"
    )
    in_group: float | None = Field(
        None,
        description="the excess that units mattering only together bring back, lost without it",
    )
    persistence: float | None = None
    estimated: float | None = None
    kind: str | None = None
    reason: str | None = None


class SelectionStep(ResultsModel):
    """One step of the greedy selection: the units added, how, and the excess left."""

    added: list[list[int]]
    by: str
    residual_fraction: float
    worst_block_fraction: float


class Causal(ResultsModel):
    """The causal selection: chosen units in order, their effects, the path there."""

    method: str
    detect_layer: int
    first_layer: int
    emergence_layer: int
    n_candidates: int
    n_images: int
    passes: int
    baseline: CausalBaseline
    residual_fraction: float
    residual_by_block: dict[str, float] = Field(description="block -> excess left (fraction)")
    chosen: list[list[int]]
    effects: list[UnitEffect]
    steps: list[SelectionStep]
    dropped: list[UnitEffect]

    def units(self) -> list[tuple[int, int]]:
        """The chosen units as ``(layer, unit)`` pairs, in selection order."""
        return [(u[0], u[1]) for u in self.chosen]

    def effect(self, layer: int, unit: int) -> UnitEffect | None:
        """The measured effect of a chosen unit (``None`` for any other)."""
        return next((e for e in self.effects if (e.layer, e.unit) == (layer, unit)), None)


class BlockCheck(ResultsModel):
    """One block that had an outlier mode before the fix, after the fix at one k."""

    layer: int
    threshold: float | None
    ordinary: float | None
    max_over_median: float
    n_above: int
    rate_above: float
    clean: bool


class Calibration(ResultsModel):
    """The top-k curve: per image resolution (key), each k's numbers after the fix."""

    target: float
    tolerance: float
    detect_layer: int
    ks: list[int]
    chosen_k: int
    status: str
    criteria: str
    outlier_rate: dict[str, list[float]]
    max_norm: dict[str, list[float]]
    median_norm: dict[str, list[float]]
    max_over_median: dict[str, list[float]]
    ordinary_max_over_median: dict[str, float]
    blocks_with_mode: dict[str, list[list[int]]]
    blocks: dict[str, list[list[BlockCheck]]]
    clean: dict[str, list[bool]]
    notes: list[str]


class Discovery(ResultsModel):
    """The images discovery ranked neurons on."""

    n_images: int | None = None
    n_images_with_outliers: int | None = None


class Stability(ResultsModel):
    """The causal sets chosen from each half of the discovery images and their overlaps."""

    method: str
    halves: list[list[list[int]]]
    overlap_between_halves: float | None
    overlap_with_whole: list[float | None]


class SizeCheck(ResultsModel):
    """The chosen set's fix on the held-out images resized to one other size."""

    img_size: int
    blocks_with_outlier_mode_before: list[int]
    blocks_with_outlier_mode_after: list[int]
    max_over_median_before: float
    max_over_median_after: float
    ordinary_max_over_median: float
    outlier_rate_before: float
    outlier_rate_after: float
    clean_after: bool


class OtherSizes(ResultsModel):
    """The fix checked at other image sizes (register neurons can be resolution-specific)."""

    method: str
    sizes: list[SizeCheck]
    clean_at_every_size: bool


class GrowthRow(ResultsModel):
    """One block of the growth curve: the detection layer's outlier patches' excess over the
    ordinary ones there, and its growth over the block before."""

    layer: int
    excess: float
    growth: float


class DetectionRecord(ResultsModel):
    """Where neurons were searched and outliers detected, each choice with why."""

    detect_layer: int
    highest_layer: int
    lowest_layer: int
    threshold: str
    threshold_value: float | None
    emergence_layer: int | None = None
    n_images: int = 0
    layers: list[SurveyRow] = Field(default_factory=list)
    reasons: dict[str, str] = Field(default_factory=dict, description="setting -> why")
    growth: list[GrowthRow] = Field(default_factory=list)
    first_written: int | None = None


class NeuronSetSettings(OpenResults):
    """The settings a NeuronSet records: the search (layers, threshold, sparsity, top-k), how
    the automatic path chose it (detection, causal selection, top-k calibration) or, for a
    published list, where it comes from; a field the set does not record is left out."""

    detect_layer: int | None = Field(None, ge=0, strict=True)
    highest_layer: int | None = Field(None, ge=0, strict=True)
    lowest_layer: int | None = Field(None, ge=0, strict=True)
    threshold: str | float | None = Field(None, description="a rule, or a norm (older files)")
    threshold_value: float | None = Field(None, gt=0, allow_inf_nan=False, strict=True)
    signed: bool | None = Field(None, strict=True)
    sparsity: list[float] | None = Field(None, description="[activation, fraction]")
    include_prefix: bool | None = Field(None, strict=True)
    top_k: int | None = Field(None, ge=0, strict=True)
    detection: DetectionRecord | None = None
    selection: Causal | None = None
    status: str | None = None
    calibration: Calibration | None = None
    source: str | None = Field(None, description="where a published list comes from")
    scores: str | None = Field(None, description="what a published list's scores are")

    @field_validator("threshold", mode="before")
    @classmethod
    def _threshold(cls, v: Any) -> Any:
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if v is None or v in MASK_RULES or (number and math.isfinite(v) and v > 0):
            return v
        raise ValueError(f"expected one of {list(MASK_RULES)} or a positive norm (a number > 0)")

    @field_validator("sparsity", mode="before")
    @classmethod
    def _sparsity(cls, v: Any) -> Any:
        ok = isinstance(v, list) and len(v) == 2
        ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        if v is None or (ok and all(math.isfinite(x) for x in v)):
            return v
        raise ValueError("expected [activation, fraction], two finite numbers")

    @model_validator(mode="before")
    @classmethod
    def _older_records(cls, data: Any) -> Any:
        """A detection, selection or calibration recorded in another shape (a set written by
        an older vitreg) kept as its JSON text in ``other`` rather than refusing the set."""
        if not isinstance(data, dict):
            return data
        data, other = dict(data), dict(data.get("other") or {})
        records: dict[str, type[ResultsModel]] = {
            "detection": DetectionRecord,
            "selection": Causal,
            "calibration": Calibration,
        }
        for key, model in records.items():
            if isinstance(data.get(key), dict):
                try:
                    model.model_validate(data[key])
                except ValidationError:
                    other[key] = as_setting(data.pop(key))
        return {**data, "other": other} if other else data


class PlantedRow(ResultsModel):
    """A planted fixture's unit: its role, and whether the run chose it."""

    layer: int
    unit: int
    role: str
    chosen: bool


class Discovered(ResultsModel):
    """The chosen set, how it was chosen, and what its fix leaves (``vitreg fix`` keeps this
    when it discovered the neurons itself)."""

    status: Literal["clean", "partial"]
    n_neurons: int
    chosen_k: int
    top_k_mode: Literal["calibrated", "fixed"]
    selection: Literal["causal", "score"]
    target: float
    tolerance: float
    detect_layer: int
    highest_layer: int
    lowest_layer: int
    threshold: str
    threshold_value: float | None
    emergence_layer: int | None
    reasons: dict[str, str] = Field(description="setting -> why it has its value")
    survey: list[SurveyRow]
    layers: list[LayerCount]
    neurons: list[NeuronRow]
    ranking: list[NeuronRow]
    causal: Causal | None
    held_out: HeldOut
    calibration: Calibration | None
    discovery: Discovery
    notes: list[str]
    stability: Stability | None = None
    other_sizes: OtherSizes | None = None


class NeuronsResults(Discovered):
    """``vitreg neurons``: the discovery, the planted ground truth, the NeuronSet files."""

    planted: list[PlantedRow] | None = None
    files: dict[str, str] = Field(description="kind (json, tensors) -> file beside metrics.json")
