"""``vitreg vlm`` results: per image, answers and language->image attention without and with
the fix on the vision tower, and their means."""

from __future__ import annotations

from itertools import zip_longest

from pydantic import Field

from vitreg.results.base import ResultsModel
from vitreg.results.fix import FixDescription, NeuronsUsed


class FirstToken(ResultsModel):
    """The most likely first answer token and its probability."""

    id: int
    token: str | None
    prob: float


class Condition(ResultsModel):
    """One image under one condition (before or after the fix)."""

    answer: str
    answer_tokens: list[int]
    n_generated: int
    positions: list[int]
    image_attention_mass: list[float]
    image_attention_mass_mean: float
    attention_map: list[list[float]]
    norm_map: list[list[float]]
    max_patch_norm: float
    max_over_median: float
    register_norm: float | None
    first_token: FirstToken


class AnswerChange(ResultsModel):
    """Whether the answer changed, and by how many tokens."""

    identical: bool
    edit_distance: int
    edit_distance_normalized: float


class FirstTokenChange(ResultsModel):
    """How the next-token distribution of the first answer token moved."""

    kl: float
    max_abs_logit_change: float
    same_top_token: bool
    top_prob_before: float
    top_prob_after_of_before_token: float


class OutlierAttention(ResultsModel):
    """The share of language->image attention on the outlier patches (None: none)."""

    n_outlier_patches: int
    rule: str
    before: float | None
    after: float | None


class SiteSplit(ResultsModel):
    """The sink / dead / alive split of the image tokens at one language-model site."""

    site: str
    layer: int = Field(
        description="hidden-state index: 0 the input (projector output), k the output of "
        "decoder layer k"
    )
    n_tokens: int
    sink: int
    dead: int
    alive: int
    alive_share: float


class TaxonomySides(ResultsModel):
    """The split at each site, without (before) and with (after) the fix."""

    before: list[SiteSplit]
    after: list[SiteSplit]


class TaxonomyAnchors(ResultsModel):
    """The vocabulary ids that mark sink and dead tokens, and where they came from."""

    sink_ids: list[int]
    dead_ids: list[int]
    sink_tokens: list[str]
    dead_tokens: list[str]
    sink_source: str
    dead_source: str


class VlmTaxonomy(ResultsModel):
    """EmbedLens's sink / dead / alive split of the image tokens, summed over images."""

    rule: str
    k: int = Field(description="nearest vocabulary tokens looked at per image token")
    anchors: TaxonomyAnchors
    before: list[SiteSplit]
    after: list[SiteSplit]

    def pairs(self) -> list[tuple[SiteSplit | None, SiteSplit | None]]:
        """Site by site, (before, after); None where one side has fewer sites."""
        return list(zip_longest(self.before, self.after))


class VlmImage(ResultsModel):
    """One image: before and after the fix, and what changed."""

    before: Condition
    after: Condition
    answer_change: AnswerChange
    first_token: FirstTokenChange
    attention_on_outliers: OutlierAttention
    taxonomy: TaxonomySides | None = None


class VlmSummary(ResultsModel):
    """Means over images (None where no image has the number)."""

    n_images: int
    identical_rate: float | None
    edit_distance_normalized: float | None
    first_token_kl: float | None
    same_first_token_rate: float | None
    attention_on_outliers_before: float | None
    attention_on_outliers_after: float | None
    max_over_median_before: float | None
    max_over_median_after: float | None
    image_attention_mass_before: float | None
    image_attention_mass_after: float | None


class Generation(ResultsModel):
    """How answers were generated: greedy, with the image token suppressed, and why."""

    greedy: bool
    suppressed_tokens: dict[str, int | None] = Field(description="token -> id")
    why: str


class VlmResults(ResultsModel):
    """``vitreg vlm``: per image, answers and attention without and with the fix."""

    prompt: str
    prompt_text: str
    query: str | list[int]
    feature_site: str
    fix: FixDescription = Field(description="the fix on the vision tower")
    generation: Generation | None = None
    summary: VlmSummary
    images: list[VlmImage]
    neurons: NeuronsUsed | None = None
    taxonomy: VlmTaxonomy | None = None
