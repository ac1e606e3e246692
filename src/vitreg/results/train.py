"""``vitreg train`` results: steps done, losses, the checkpoint, and every setting that shaped
the run."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from vitreg.results.base import ResultsModel, Setting


class TrainedModel(ResultsModel):
    """The timm architecture and the keyword arguments it was created with."""

    name: str
    kwargs: dict[str, Setting] = Field(
        default_factory=dict, description="timm create_model keyword -> its value"
    )


class SupervisedOptions(ResultsModel):
    """The supervised recipe's options: label smoothing and the 3-Augment colour jitter."""

    label_smoothing: float
    jitter: float


class DinoRecipeOptions(ResultsModel):
    """The DINO recipe's options: crops, head size, temperatures, EMA and centring momenta,
    masking, loss weights."""

    n_local_crops: int
    local_size: int | None = Field(description="None: 96/224 of the image size")
    global_scale: list[float] = Field(description="[min, max] crop area")
    local_scale: list[float] = Field(description="[min, max] crop area")
    out_dim: int
    hidden_dim: int
    bottleneck_dim: int
    student_temp: float
    teacher_temp: float
    teacher_temp_start: float
    teacher_temp_warmup: float = Field(description="fraction of the steps")
    momentum: float
    center_momentum: float
    mask_prob: float
    mask_ratio: list[float] = Field(description="[min, max] of the masked patches")
    dino_weight: float
    ibot_weight: float


#: a recipe's options (the recipe named beside them says which)
RecipeOptions = Annotated[
    SupervisedOptions | DinoRecipeOptions,
    Field(union_mode="left_to_right"),
]


class TrainingData(ResultsModel):
    """What a run trains on (a resume on other data is refused): spec, samples, fingerprint."""

    spec: str
    n: int
    fingerprint: str | None


class TrainConfigRecord(ResultsModel):
    """``TrainConfig``: every number that shapes a run (stored in each checkpoint too)."""

    recipe: str
    steps: int
    batch_size: int
    lr: float
    min_lr: float
    weight_decay: float
    warmup_steps: int
    clip_grad: float | None
    accum_steps: int
    amp: str
    seed: int
    img_size: int
    checkpoint_every: int
    keep_checkpoints: int
    model: TrainedModel
    options: RecipeOptions = Field(description="the recipe's own options")
    data: TrainingData


class DinoStep(ResultsModel):
    """The [CLS] DINO loss at one step (with the teacher's entropy and KL at the last)."""

    step: int
    loss_dino: float
    teacher_entropy: float | None = None
    kl: float | None = None


class DinoTerms(ResultsModel):
    """What the DINO loss did: its lowest value and its last, against ln(out_dim)."""

    out_dim: int
    ln_out_dim: float
    lowest: DinoStep
    final: DinoStep


class TrainResults(ResultsModel):
    """``vitreg train``: steps done, losses, the checkpoint and the settings."""

    recipe: str
    steps: int
    total_steps: int | None = None
    final_loss: float | None
    loss_first: float | None
    resumed_from: int | None
    weights: str | None
    log: str
    train_config: TrainConfigRecord
    dino_terms: DinoTerms | None = None
