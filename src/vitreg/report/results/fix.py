"""``vitreg fix`` results: before/after comparison of test-time registers (with the per-block
residual verdict and the ablation controls), which neurons, and the discovery when it ran."""

from __future__ import annotations

from pydantic import Field, JsonValue

from vitreg.report.results.base import Strict
from vitreg.report.results.neurons import Discovered, LayerCount, PlantedRow


class FixSettings(Strict):
    """The test-time-register edit: neurons, registers, what [CLS] and patches get."""

    n_neurons: int
    layers: list[int]
    n_registers: int
    cls: str
    patches: str
    mode: str
    seed: int | None
    scale: float


class Cosine(Strict):
    """Cosine similarity before vs after: mean, min, over how many vectors."""

    mean: float
    min: float
    n: int


class Control(Strict):
    """One control: ablate the register neurons, random neurons, or shift to a patch."""

    n_neurons: int
    outlier_rate: float
    pooled_cosine: Cosine | None
    patch: int | None = None
    share_of_images_with_top_norm_at_patch: float | None = None


class Residual(Strict):
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


class Comparison(Strict):
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


class NeuronsUsed(Strict):
    """The NeuronSet the fix used: where it came from and what it recorded."""

    source: str
    model_spec: str | None
    n_neurons: int
    layers: list[LayerCount]
    fingerprint: str | None
    fingerprint_matches: bool | None
    settings: dict[str, JsonValue] = Field(description="the settings its file recorded, as read")


class FixResults(Strict):
    """``vitreg fix``: the comparison, the neurons, the discovery when none were given and the
    planted ground truth."""

    comparison: Comparison
    neurons: NeuronsUsed
    discovery: Discovered | None = None
    saved: str | None = None
    planted: list[PlantedRow] | None = None
