"""What one trained (variant, seed) is evaluated to: its probe scores, diagnosis and costs, as
``result.json`` records them."""

from __future__ import annotations

from pydantic import Field

from vitreg.results.base import ResultsModel, SparseResults
from vitreg.results.experiment import FlopCounts, ParamCounts


class ScoreSummary(ResultsModel):
    """One probe score of the last layer's base condition: mean, 95% half-width, per seed."""

    mean: float | None
    ci95: float | None
    values: list[float | None]


class TaskProbes(ResultsModel):
    """One probe task on the last block: its scores and the task's notes."""

    scores: dict[str, ScoreSummary] = Field(description='"feature/metric" -> the score')
    notes: list[str]


class SeedDiagnosis(SparseResults):
    """The outlier verdict and rate, and the token-pair cosines per block around ``norm1`` (a
    pair only where the model has it)."""

    verdict: str
    artifacts_present: bool
    outlier_rate: float
    emergence_layer: int | None
    n_images: int
    not_applicable: dict[str, str] = Field(description="analysis -> why it did not apply")
    cls_patch_pre_ln1: list[float | None] | None = None
    patch_patch_pre_ln1: list[float | None] | None = None
    register_patch_pre_ln1: list[float | None] | None = None
    cls_patch_post_ln1: list[float | None] | None = None
    patch_patch_post_ln1: list[float | None] | None = None
    register_patch_post_ln1: list[float | None] | None = None
    owned_channel_fraction: list[float | None] | None = None


class SeedEvaluation(ResultsModel):
    """Probes, diagnosis and costs of one trained backbone."""

    probes: dict[str, TaskProbes] = Field(description="task -> its scores and notes")
    diagnose: SeedDiagnosis
    params: ParamCounts
    flops: FlopCounts
