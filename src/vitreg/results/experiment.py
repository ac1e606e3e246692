"""``vitreg experiment`` results: every variant's costs, probes and diagnosis over its seeds,
the settings and the conclusions the numbers allow."""

from __future__ import annotations

from pydantic import Field

from vitreg.results.base import ResultsModel, SparseResults
from vitreg.results.train import DinoTerms

#: blocks a component is specialised in: "all", the first N, or their indices
BlockSelection = str | int | list[int] | None


class VariantOptions(SparseResults):
    """A variant's ``create_variant`` options; an option the grid leaves at its default is
    left out."""

    specialize: list[str] = Field(description="components given a [CLS]-stream copy")
    registers: int | None = None
    qkv_blocks: BlockSelection = None
    proj_blocks: BlockSelection = None
    mlp_blocks: BlockSelection = None
    register_stream: str | None = None
    final_norm: str | None = None
    attn_bias: bool | None = None
    pool: str | None = None


class ParamCounts(ResultsModel):
    """Parameter counts: the variant's, its shared baseline's, and the extra per component."""

    total: int
    baseline: int
    extra: dict[str, int] = Field(description="component -> extra parameters")
    percent: dict[str, float] = Field(description="component -> extra, % of the baseline")
    extra_total: int


class FlopDeltas(ResultsModel):
    """FLOPs a variant adds over its shared model, by cause."""

    specialisation: int
    attn_bias: int
    registers: int


class FlopCounts(ResultsModel):
    """FLOPs of one forward at the variant's image size, and of the same shared model."""

    image_size: list[int]
    tokens: int
    registers: int
    flops: int
    flops_shared: int
    delta: FlopDeltas


class DinoPresetOptions(SparseResults):
    """The DINO recipe options the size preset sets (the rest keep the recipe's defaults)."""

    n_local_crops: int | None = None
    local_size: int | None = None
    global_scale: list[float] | None = None
    local_scale: list[float] | None = None
    out_dim: int | None = None
    hidden_dim: int | None = None
    bottleneck_dim: int | None = None
    student_temp: float | None = None
    teacher_temp: float | None = None
    teacher_temp_start: float | None = None
    teacher_temp_warmup: float | None = None
    momentum: float | None = None
    center_momentum: float | None = None
    mask_prob: float | None = None
    mask_ratio: list[float] | None = None
    dino_weight: float | None = None
    ibot_weight: float | None = None


class ExperimentSettings(ResultsModel):
    """The size preset: the shared architecture, training, probes and diagnosis."""

    size: str
    img_size: int
    patch_size: int
    depth: int
    embed_dim: int
    num_heads: int
    init_values: float
    recipe: str
    steps: int
    batch_size: int
    lr: float | None
    seeds: int = Field(description="training seeds per variant")
    dino: DinoPresetOptions
    probe_epochs: int
    probe_seeds: int
    probe_lrs: list[float]
    diagnose_images: int
    batch_eval: int


class SeedStats(ResultsModel):
    """One number over a variant's seeds: mean, sample std (None for one seed), values."""

    mean: float | None
    std: float | None
    values: list[float | None]


class VariantTime(ResultsModel):
    """Seconds spent training and evaluating one variant."""

    train: float
    evaluate: float


class VariantSummary(ResultsModel):
    """One variant over its training seeds."""

    name: str
    options: VariantOptions
    specialisation: str
    handling: str
    finetune: str | None = None
    folder: str
    seeds: list[int]
    summary: dict[str, SeedStats] = Field(description="headline number -> over seeds")
    per_block: dict[str, list[float | None]] = Field(description="number -> per block")
    params: ParamCounts
    flops: FlopCounts
    verdicts: list[str]
    losses: list[list[float]]
    dino_terms: DinoTerms | None = None
    time_s: VariantTime
    reused: bool
    notes: list[str]


class Timing(ResultsModel):
    """Wall and compute time of this invocation, and variants reused from earlier ones."""

    wall_s: float
    compute_s: float
    reused: int


class ExperimentResults(ResultsModel):
    """``vitreg experiment``: every variant's costs, probes and diagnosis."""

    complete: bool
    n_done: int
    n_total: int
    settings: ExperimentSettings
    data: str
    tasks: list[str]
    skipped_tasks: dict[str, str] = Field(default_factory=dict)
    variants: list[VariantSummary]
    timing: Timing
    majority_rate: float | None = None
    conclusions: list[str]
