"""How ``vitreg experiment sae`` trains its sparse autoencoders: the site they read, their size,
sparsity and training, the seeds and the held-out share of images."""

from __future__ import annotations

from pydantic import Field, PositiveInt

from vitreg.settings.base import SettingsPart


class SaeSettings(SettingsPart):
    """One TopK SAE recipe, the same in every arm of the study."""

    layer: int | None = Field(
        None,
        ge=-64,
        le=1024,
        description="Block whose output (blocks.L.hook_resid_post) the SAEs read; negative "
        "counts from the end (default: the second-to-last block).",
    )
    expansion: PositiveInt = Field(4, le=64, description="Latents per model dimension.")
    k: PositiveInt = Field(8, le=4096, description="Active latents per token (TopK).")
    steps: PositiveInt = Field(
        300, le=1_000_000, description="SAE training steps per arm and seed."
    )
    tokens: PositiveInt = Field(256, le=1_000_000, description="Tokens per SAE training step.")
    lr: float = Field(1e-3, gt=0.0, le=1.0, description="Adam learning rate of the SAEs.")
    seeds: PositiveInt = Field(
        3,
        le=100,
        description="Seeds: each draws its own image split and SAE initialisation (mean and "
        "95% interval over them).",
    )
    held_out: float = Field(
        0.25, gt=0.0, lt=1.0, description="Share of the images held out for evaluation."
    )
