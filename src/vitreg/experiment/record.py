"""The experiment's own records: its plan (``experiment.json``) and what one trained (variant,
seed) depends on and is evaluated to: its training, probe scores, diagnosis and costs
(``result.json``)."""

from __future__ import annotations

from pydantic import Field, JsonValue, field_serializer

from vitreg.results.base import ResultsModel, SparseResults
from vitreg.results.experiment import (
    ExperimentSettings,
    FlopCounts,
    ParamCounts,
    Variant,
    VariantTime,
)
from vitreg.results.train import DinoTerms


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


class ExperimentPlan(ResultsModel):
    """What an experiment folder runs (``experiment.json``): a rerun continues it only with the
    same settings and data."""

    settings: ExperimentSettings
    data: str
    variants: list[Variant]
    tasks: list[str]
    skipped_tasks: dict[str, str] = Field(description="probe task -> why it was not run")
    majority_rate: float | None
    pretrained: bool


class SeedRunConfig(ResultsModel):
    """What a (variant, seed) result depends on; a saved result is reused only if it matches."""

    variant: Variant
    seed: int
    settings: ExperimentSettings
    data: str
    pretrained: bool


class SeedTraining(ResultsModel):
    """How one (variant, seed) trained: steps, losses, the [CLS] DINO term, resume, notes."""

    steps: int
    first_loss: float | None
    final_loss: float | None
    losses: list[float]
    dino_terms: DinoTerms | None = Field(
        description="the [CLS] DINO term against the teacher's entropy (None: supervised)"
    )
    resumed_from: int | None
    notes: list[str]

    @field_serializer("dino_terms")
    def _terms_as_measured(self, terms: DinoTerms | None) -> dict[str, JsonValue] | None:
        """The terms without the fields :func:`~vitreg.train.dino.loss_terms` left unset."""
        return terms.model_dump(exclude_unset=True) if terms is not None else None


class SeedOrigin(ResultsModel):
    """What a (variant, seed) result was made with, and how it trained."""

    config: SeedRunConfig
    train: SeedTraining


class SeedRecord(SeedEvaluation, SeedOrigin):
    """One (variant, seed) as ``result.json`` holds it; ``reused`` (not written) says whether
    this run read it from an earlier one."""

    time_s: VariantTime
    reused: bool = Field(False, exclude=True)
