"""``leaderboard.json`` of ``vitreg fix --method a,b,...``: every fix measured side by side on
one model and one image set, and what produced the board (versions, command, config, model)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from vitreg.results.base import SparseResults, Stamp
from vitreg.results.fix import Cosine, FixDescription
from vitreg.results.probe import OvSegProtocolRecord, ProbeScore
from vitreg.results.schema import DataInfo, ModelDescription, ModelInfo, model_info


class BoardEntry(SparseResults):
    """One entry's measurements; ``refused`` holds the reason when the model cannot take it."""

    entry: str
    fix: FixDescription | None = Field(
        description="the fix as it describes itself (a composition: its parts); None for the "
        "unfixed model and a refused entry"
    )
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
    scores: dict[str, ProbeScore] = Field(
        description="probe 'TASK metric' -> its score over seeds (mean, ci95, ...)"
    )
    protocol: OvSegProtocolRecord | None = Field(
        None, description="ov-seg --protocol published: the settings this row was scored with"
    )

    @field_validator("fix", mode="before")
    @classmethod
    def _named(cls, v: Any) -> Any:
        """Boards written before fixes were named: ``{}`` (refused) is None, and an entry's
        method names it."""
        if isinstance(v, dict) and "name" not in v:
            return {"name": v["method"], **v} if "method" in v else None
        return v


class BoardResults(SparseResults):
    """The leaderboard: the unfixed model first, then every entry (parts before compositions)."""

    n_images: int
    rows: list[BoardEntry]
    protocol: str | None = Field(
        None, description="ov-seg --protocol published (left out: shared or no ov-seg probe)"
    )


class BoardDocument(Stamp):
    """leaderboard.json: the board and what produced it (versions and time as metrics.json)."""

    model: str
    synthetic: bool
    data: DataInfo = Field(description="the images, as described")
    command: str
    config: dict[str, Any] = Field(description="the resolved config the board was made with")
    model_info: ModelInfo | None = Field(None, description="the model measured, as described")
    board: BoardResults

    @field_validator("model_info", mode="before")
    @classmethod
    def _described(cls, v: Any) -> Any:
        """Boards written before the model was recorded hold ``{}``; before it was regrouped as
        metrics.json's, ``Model.describe()`` as it is."""
        if isinstance(v, dict) and v and "dims" not in v:
            return model_info(ModelDescription.model_validate(v))
        return v or None
