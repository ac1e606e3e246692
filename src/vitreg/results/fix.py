"""``vitreg fix`` results: before/after comparison of test-time registers (with the per-block
residual verdict and the ablation controls), which neurons, and the discovery when it ran."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from vitreg.results.base import OpenResults, ResultsModel
from vitreg.results.neurons import Discovered, LayerCount, NeuronSetSettings, PlantedRow


class FixSettings(ResultsModel):
    """The test-time-register edit: neurons, registers, what [CLS] and patches get."""

    n_neurons: int
    layers: list[int]
    n_registers: int
    cls: str
    patches: str
    mode: str
    seed: int | None
    scale: float


class NamedFix(ResultsModel):
    """A fix as a run describes it: its name (the class, or the method inside a composition)."""

    name: str = Field(description="the fix's class, or its method name inside a composition")


class TtrDescription(FixSettings, NamedFix):
    """Test-time registers: the neurons' blocks, registers, what [CLS] and patches get."""


class AblateDescription(NamedFix):
    """The causal control: the register neurons zeroed, no register."""

    method: Literal["ablate"]
    n_neurons: int


class AttentionBiasDescription(NamedFix):
    """The TTR appendix substitute: neurons zeroed plus one fixed key/value slot per head."""

    method: Literal["attention-bias"]
    n_neurons: int
    layers: int = Field(description="blocks holding a key/value slot")
    heads: int


class ScClipDescription(NamedFix):
    """SC-CLIP: LOF token repair, similarity re-aggregation and multi-level fusion."""

    method: Literal["sc-clip"]
    source: str
    n_neighbors: int
    contamination: float
    beta: float
    pre_adjust: int
    post_adjust: int
    multi: list[int] = Field(description="the fused blocks, [start, stop)")
    res_cls: float


class RfClipDescription(NamedFix):
    """RF-CLIP: distraction channels, the blocks edited and the share threshold."""

    method: Literal["rf-clip"]
    source: str
    channels: list[int] = Field(description="the distraction channels")
    layers: list[int] = Field(description="the blocks whose attention and input are edited")
    tau: float | None = Field(
        description="share of |activation| above which a token is a "
        "distraction token; null: the paper's 5/d"
    )


class OvStitcherDescription(NamedFix):
    """OV-Stitcher: sliding-window features stitched into one global final block."""

    method: Literal["ov-stitcher"]
    source: str
    final_block: str = Field(description="the attention of the stitched final block")


class LastBlockDescription(OpenResults, NamedFix):
    """A training-free fix that rebuilds the last block's attention (ClearCLIP, SCLIP, NACLIP):
    whether the residual and FFN stay, and the method's own parameters."""

    method: str
    source: str
    block: Literal["last"]
    residual: bool
    ffn: bool
    gaussian_std: float | None = Field(None, description="NACLIP's neighbourhood width")


class ComposedDescription(NamedFix):
    """Fixes applied together (``ttr+naclip``): each part as it describes itself."""

    method: str = Field(description="the parts' method names joined by '+'")
    parts: list[FixDescription]


class OtherFixDescription(OpenResults, NamedFix):
    """A fix vitreg does not know (a library user's own): its name and its own description."""

    method: str | None = None


#: a fix as a run describes it; the first kind that reads the description exactly is taken
FixDescription = Annotated[
    TtrDescription
    | AblateDescription
    | AttentionBiasDescription
    | ScClipDescription
    | RfClipDescription
    | OvStitcherDescription
    | LastBlockDescription
    | ComposedDescription
    | OtherFixDescription,
    Field(union_mode="left_to_right"),
]
ComposedDescription.model_rebuild()


class Cosine(ResultsModel):
    """Cosine similarity before vs after: mean, min, over how many vectors."""

    mean: float
    min: float
    n: int


class Control(ResultsModel):
    """One control: ablate the register neurons, random neurons, or shift to a patch."""

    n_neurons: int
    outlier_rate: float
    pooled_cosine: Cosine | None
    patch: int | None = None
    share_of_images_with_top_norm_at_patch: float | None = None


class Residual(ResultsModel):
    """What the fix leaves, judged by the presence test at every block and the max/median
    patch norm against the ordinary patches' level."""

    clean: bool
    nothing_to_fix: bool
    verdict: str
    threshold_from_another_model: bool
    largest_patch_norm_before: float
    blocks_with_mode_before: list[int]
    blocks_with_mode_after: list[int]
    max_over_median_before: list[float]
    max_over_median_after: list[float]
    ordinary_max_over_median: float | None
    tolerance: float


class Comparison(ResultsModel):
    """Before vs after the fix, per block where a list."""

    fix: FixSettings
    detect_layer: int
    rule: str
    threshold_value: float | None
    outlier_rate_before: float
    outlier_rate_after: float
    max_patch_norm_before: list[float]
    max_patch_norm_after: list[float]
    median_patch_norm_before: list[float]
    median_patch_norm_after: list[float]
    register_norm_after: list[float | None]
    verdict_before: bool
    verdict_after: bool
    pooled_cosine: Cosine | None
    patch_cosine: Cosine | None
    cls_attention_max_before: list[float] | None
    cls_attention_max_after: list[float] | None
    controls: dict[str, Control] = Field(description="control name -> its numbers")
    residual: Residual


class NeuronsUsed(ResultsModel):
    """The NeuronSet the fix used: where it came from and what it recorded."""

    source: str
    model_spec: str | None
    n_neurons: int
    layers: list[LayerCount]
    fingerprint: str | None
    fingerprint_matches: bool | None
    settings: NeuronSetSettings = Field(description="the settings its file recorded")


class FixResults(ResultsModel):
    """``vitreg fix``: the comparison, the neurons, the discovery when none were given and the
    planted ground truth."""

    comparison: Comparison
    neurons: NeuronsUsed
    discovery: Discovered | None = None
    saved: str | None = None
    planted: list[PlantedRow] | None = None
