"""``vitreg train`` results: steps done, losses, the checkpoint, and every setting that shaped
the run."""

from __future__ import annotations

from pydantic import Field, JsonValue

from vitreg.report.results.base import Strict


class TrainedModel(Strict):
    """The timm architecture and the keyword arguments it was created with."""

    name: str
    kwargs: dict[str, JsonValue] = Field(default_factory=dict, description="timm create_model")


class TrainConfigRecord(Strict):
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
    options: dict[str, JsonValue] = Field(description="the recipe's own options")
    data: dict[str, JsonValue] = Field(description="the training data's identity")


class DinoStep(Strict):
    """The [CLS] DINO loss at one step (with the teacher's entropy and KL at the last)."""

    step: int
    loss_dino: float
    teacher_entropy: float | None = None
    kl: float | None = None


class DinoTerms(Strict):
    """What the DINO loss did: its lowest value and its last, against ln(out_dim)."""

    out_dim: int
    ln_out_dim: float
    lowest: DinoStep
    final: DinoStep


class TrainResults(Strict):
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
