"""What a training run may set, typed once: :func:`vitreg.train.train` takes it, and
``vitreg train``'s config (:class:`~vitreg.configs.TrainRunConfig`) composes it, so the library's
defaults, the CLI's and config.yaml's are the same. Torch-free: the CLI builds its help from it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from vitreg.core.choices import AMP, MAX_SEED, RECIPES


class TrainSettings(BaseModel):
    """The settings of one training run (``None``: the recipe's default, resolved in
    :class:`~vitreg.results.train.ResolvedTrainConfig`)."""

    model_config = ConfigDict(extra="forbid")

    recipe: Literal[RECIPES] = Field(  # type: ignore[valid-type]
        "supervised", description="supervised (DeiT III) or dino (DINO/iBOT)."
    )
    steps: PositiveInt | None = Field(None, description="Optimizer steps.")
    epochs: float | None = Field(None, gt=0, description="Epochs (instead of --steps).")
    batch_size: int = Field(
        64,
        gt=0,
        le=65536,
        description="Global batch per step (all ranks and accumulation steps).",
    )
    lr: float | None = Field(
        None, gt=0, description="Peak learning rate (default: the recipe's base rate x batch/256)."
    )
    min_lr: float | None = Field(
        None, ge=0, description="Final learning rate of the cosine schedule (default lr/1000)."
    )
    weight_decay: float | None = Field(
        None, ge=0, description="AdamW weight decay (default: the recipe's, 0.05 or 0.04)."
    )
    warmup_steps: int | None = Field(
        None, ge=0, description="Linear warm-up steps (default a tenth of the steps)."
    )
    clip_grad: float | None = Field(
        None, gt=0, description="Gradient-norm clipping (default: the recipe's; dino 3.0)."
    )
    accum_steps: PositiveInt = Field(1, description="Gradient accumulation steps.")
    amp: Literal[AMP] = Field(  # type: ignore[valid-type]
        "auto", description="auto (bf16/fp16 on CUDA, off on CPU), off, bf16, fp16."
    )
    seed: int = Field(
        0, ge=0, le=MAX_SEED, description="Seed for init, data order and augmentations."
    )
    img_size: PositiveInt | None = Field(
        None, description="Input size in pixels (default: the model's)."
    )
    checkpoint_every: PositiveInt | None = Field(
        None, description="Steps between checkpoints (and at the end; default min(1000, steps))."
    )
    keep_checkpoints: PositiveInt = Field(2, description="Newest checkpoints kept on disk.")
    resume: bool = Field(True, description="Continue from the newest checkpoint in --out.")
    extend: bool = Field(
        False,
        description="Resume with a larger --steps: continue the run on a schedule stretched to "
        "the new total (without it, another total is refused).",
    )
    device: str | None = Field(None, description="torch device, e.g. cpu or cuda:0.")
