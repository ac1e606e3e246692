"""``vitreg experiment sae`` results: the same TopK SAE trained on raw activations, on raw
activations with the outlier tokens left out, and on the fixed model's activations; each arm's
measures on held-out images over seeds (mean and 95% half-width)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vitreg.results.base import ResultsModel
from vitreg.results.fix import NeuronsUsed
from vitreg.settings.sae import SaeSettings

ArmName = Literal["raw", "excluded", "fixed"]

#: the measures of an arm, in the order the report shows them
MEASURES = ("ordinary_error", "dead_latents", "outlier_latents", "outlier_loss_share")


class SeedMeasure(ResultsModel):
    """One measure over the seeds: the mean, its Student-t 95% half-width (None for one seed)
    and each seed's value."""

    mean: float | None
    ci95: float | None
    values: list[float | None]


class SaeArm(ResultsModel):
    """One arm: what its SAE was trained on and its four measures on the held-out images."""

    name: ArmName
    trained_on: str = Field(description="the tokens its SAE was trained on, in words")
    train_tokens: list[int] = Field(description="training tokens per seed")
    ordinary_error: SeedMeasure = Field(
        description="fraction of variance unexplained on the held-out ordinary patches"
    )
    dead_latents: SeedMeasure = Field(
        description="share of latents never active on the arm's held-out patch tokens"
    )
    outlier_latents: SeedMeasure = Field(
        description="share of latents for which more than half of the held-out tokens they "
        "fire on are at outlier positions"
    )
    outlier_loss_share: SeedMeasure | None = Field(
        description="squared error on the outlier positions / on all held-out patch tokens "
        "(None: an arm that never saw outlier tokens)"
    )


class SaeResults(ResultsModel):
    """The study: the site, the outlier rule fitted on the raw model, the split, the SAE recipe,
    the fix's neurons and the three arms."""

    site: str
    layer: int
    outlier_rule: str = Field(description="the rule that flags outlier patch tokens, in words")
    outlier_threshold: float = Field(description="patch norm above which a token is an outlier")
    outlier_tokens: SeedMeasure = Field(
        description="share of the held-out patch tokens flagged as outliers"
    )
    n_images: int
    held_out_images: int = Field(description="images held out per seed")
    patches_per_image: int
    n_latents: int
    sae: SaeSettings = Field(description="the SAE recipe, the same in every arm")
    neurons: NeuronsUsed = Field(description="the register neurons of the fixed arm's fix")
    arms: list[SaeArm]
