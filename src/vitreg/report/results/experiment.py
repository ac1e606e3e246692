"""``vitreg experiment`` results: every variant's costs, probes and diagnosis over its seeds,
the settings and the conclusions the numbers allow."""

from __future__ import annotations

from pydantic import Field, JsonValue

from vitreg.report.results.base import Strict
from vitreg.report.results.train import DinoTerms


class SeedStats(Strict):
    """One number over a variant's seeds: mean, sample std (None for one seed), values."""

    mean: float | None
    std: float | None
    values: list[float | None]


class VariantTime(Strict):
    """Seconds spent training and evaluating one variant."""

    train: float
    evaluate: float


class VariantSummary(Strict):
    """One variant over its training seeds."""

    name: str
    options: dict[str, JsonValue] = Field(description="its create_variant options")
    specialisation: str
    handling: str
    finetune: str | None = None
    folder: str
    seeds: list[int]
    summary: dict[str, SeedStats] = Field(description="headline number -> over seeds")
    per_block: dict[str, list[float | None]] = Field(description="number -> per block")
    params: dict[str, JsonValue] = Field(description="parameter counts, extra by component")
    flops: dict[str, JsonValue] = Field(description="FLOPs, tokens, deltas by component")
    verdicts: list[str]
    losses: list[list[float]]
    dino_terms: DinoTerms | None = None
    time_s: VariantTime
    reused: bool
    notes: list[str]


class Timing(Strict):
    """Wall and compute time of this invocation, and variants reused from earlier ones."""

    wall_s: float
    compute_s: float
    reused: int


class ExperimentResults(Strict):
    """``vitreg experiment``: every variant's costs, probes and diagnosis."""

    complete: bool
    n_done: int
    n_total: int
    settings: dict[str, JsonValue] = Field(description="the size preset's settings")
    data: str
    tasks: list[str]
    skipped_tasks: dict[str, str] = Field(default_factory=dict)
    variants: list[VariantSummary]
    timing: Timing
    majority_rate: float | None = None
    conclusions: list[str]
