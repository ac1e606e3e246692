"""``leaderboard.json`` of ``vitreg fix --method a,b,...``: every fix measured side by side on
one model and one image set, and what produced the board (versions, command, config, model)."""

from __future__ import annotations

from pydantic import Field, JsonValue

from vitreg.report.results.base import Stamp, Strict
from vitreg.report.results.fix import Cosine


class BoardEntry(Strict):
    """One entry's measurements; ``refused`` holds the reason when the model cannot take it."""

    entry: str
    fix: dict[str, JsonValue] = Field(description="the fix's settings (a composition: its parts)")
    part_of: list[str]
    refused: str | None
    blocks_with_mode: list[int]
    clean: bool | None
    max_over_median: list[float]
    residual_max_over_median: float | None
    last_block_max_over_median: float | None
    pooled_cosine: Cosine | None
    patch_cosine: Cosine | None
    images_per_s: float | None
    relative_speed: float | None
    scores: dict[str, dict[str, JsonValue]] = Field(
        description="probe TASK metric -> its score over seeds (mean, ci95, ...)"
    )


class BoardResults(Strict):
    """The leaderboard: the unfixed model first, then every entry (parts before compositions)."""

    n_images: int
    rows: list[BoardEntry]


class BoardDocument(Stamp):
    """leaderboard.json: the board and what produced it (versions and time as metrics.json)."""

    model: str
    synthetic: bool
    data: dict[str, JsonValue] = Field(description="the images, as described")
    command: str
    config: dict[str, JsonValue] = Field(description="the resolved config the board was made with")
    model_info: dict[str, JsonValue] = Field(
        default_factory=dict, description="Model.describe() of the model measured"
    )
    board: BoardResults
