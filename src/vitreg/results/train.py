"""``vitreg train`` results: steps done, losses, the checkpoint, and every setting that shaped
the run. :class:`ResolvedTrainConfig` is the resolved config a run trained with: the library builds it,
and every checkpoint, train.json and metrics.json holds it."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from vitreg.core.renamed import renamed
from vitreg.results.base import ResultsModel, Setting


class TrainedModel(ResultsModel):
    """The timm architecture and the keyword arguments it was created with."""

    name: str
    kwargs: dict[str, Setting] = Field(
        default_factory=dict, description="timm create_model keyword -> its value"
    )


class TrainedVariant(ResultsModel):
    """A vitreg variant spec (its options as given) and the timm keyword arguments."""

    variant: dict[str, Setting] = Field(description="variant option -> its value")
    kwargs: dict[str, Setting] = Field(
        default_factory=dict, description="timm create_model keyword -> its value"
    )


class TrainedInstance(ResultsModel):
    """A model instance handed to ``train``: its class and parameter count."""

    instance: str
    params: int


#: what a run trained: a timm name, a variant spec or an instance
TrainedIdentity = Annotated[
    TrainedModel | TrainedVariant | TrainedInstance, Field(union_mode="left_to_right")
]


class SupervisedOptions(ResultsModel):
    """The supervised recipe's options: label smoothing of the BCE targets and the colour-jitter
    strength of 3-Augment."""

    label_smoothing: float = 0.0
    jitter: float = 0.3


class DinoOptions(ResultsModel):
    """The DINO recipe's options: crops, head size, temperatures, EMA and centring momenta,
    masking, loss weights."""

    n_local_crops: int = 4
    local_size: int | None = Field(
        None, description="None: 96/224 of the image size, rounded to whole patches"
    )
    global_scale: list[float] = Field([0.32, 1.0], description="[min, max] crop area")
    local_scale: list[float] = Field([0.05, 0.32], description="[min, max] crop area")
    out_dim: int = 4096
    hidden_dim: int = 2048
    bottleneck_dim: int = 256
    student_temp: float = 0.1
    teacher_temp: float = 0.07
    teacher_temp_start: float = 0.04
    teacher_temp_warmup: float = Field(0.3, description="fraction of the steps")
    momentum: float = Field(0.992, description="EMA momentum at step 0, cosine to 1 at the end")
    center_momentum: float = 0.9
    mask_prob: float = Field(0.5, description="fraction of global crops with masked patches")
    mask_ratio: list[float] = Field([0.1, 0.5], description="[min, max] of the masked patches")
    dino_weight: float = 1.0
    ibot_weight: float = 1.0


#: each recipe's options model
RECIPE_OPTIONS: dict[str, type[SupervisedOptions] | type[DinoOptions]] = {
    "supervised": SupervisedOptions,
    "dino": DinoOptions,
}

#: a recipe's options (the recipe named beside them says which)
RecipeOptions = Annotated[
    SupervisedOptions | DinoOptions,
    Field(union_mode="left_to_right"),
]


class TrainingData(ResultsModel):
    """What a run trains on (a resume on other data is refused): spec, samples, fingerprint."""

    spec: str
    n: int
    fingerprint: str | None


class ResolvedTrainConfig(ResultsModel):
    """Every number that shapes a run, resolved (the recipe's defaults filled in): stored in
    each checkpoint, in train.json and in metrics.json. A stored config names every option of
    its recipe."""

    recipe: str
    steps: int
    batch_size: int = Field(description="global: images per optimizer step over all ranks")
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
    model: TrainedIdentity
    options: RecipeOptions = Field(description="the recipe's own options")
    data: TrainingData

    @model_validator(mode="before")
    @classmethod
    def _every_option(cls, data: Any) -> Any:
        """A record read as data holds each of its recipe's options (none left to defaults)."""
        if not isinstance(data, dict) or not isinstance(data.get("options"), dict):
            return data
        kind = RECIPE_OPTIONS.get(str(data.get("recipe")))
        missing = [k for k in kind.model_fields if k not in data["options"]] if kind else []
        if missing:
            raise ValueError(f"the {data['recipe']} options lack {', '.join(missing)}")
        return data


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
    train_config: ResolvedTrainConfig
    dino_terms: DinoTerms | None = None


__getattr__ = renamed(
    __name__,
    {
        "TrainConfigRecord": "ResolvedTrainConfig",
        "TrainConfig": "ResolvedTrainConfig",
        "DinoRecipeOptions": "DinoOptions",
    },
    globals(),
)
