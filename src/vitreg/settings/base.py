"""The shared ground of every settings part: the :class:`SettingsPart` base, the defaults and field
validators that several parts use, and the figure settings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from vitreg.core.choices import MAX_IMG_SIZE, NAMED_THRESHOLDS

DEFAULT_SPEC = "planted:dinov2_s14"  # the embedded demo: a synthetic ViT with planted artifacts
Threshold = Literal[NAMED_THRESHOLDS] | float  # type: ignore[valid-type]  # or an absolute norm
FigureFormat = Literal["svg", "pdf"] | None  # every figure also in this format (PNG always)
BATCH = Field(32, gt=0, le=65536, description="Images per forward pass.")
CHECKPOINT_EVERY = Field(
    None,
    gt=0,
    description="Save the streaming statistics every N images into OUT.resume (beside the run); "
    "running the same command again resumes from there (removed once the run is written).",
)


def valid_weights_file(v: Path | None) -> Path | None:
    """A ``--weights`` file that exists and that vitreg reads (checked before any model loads)."""
    if v is not None:
        from vitreg.core.weights import check_weights_file
        from vitreg.errors import VitregError

        try:
            check_weights_file(v)
        except VitregError as e:
            raise ValueError(str(e)) from None
    return v


def valid_device(v: str | None) -> str | None:
    """A ``--device`` that exists on this machine and holds data (checked before any model
    loads: ``meta``, or ``cuda`` without a GPU, is an error naming the option, not a traceback)."""
    if v is not None:
        from vitreg.device import device_problem

        problem = device_problem(v)
        if problem is not None:
            raise ValueError(problem)
    return v


def valid_img_size(v: int | None) -> int | None:
    """An ``--img-size`` a ViT can take, checked here so that no verb allocates for it first."""
    if v is not None and not 1 <= v <= MAX_IMG_SIZE:
        raise ValueError(
            f"the input size must be a whole number of pixels from 1 to {MAX_IMG_SIZE}; ViTs "
            "take 224 or 518, or a multiple of their patch size near it"
        )
    return v


def finite(v: float | None, name: str) -> float | None:
    if v is not None and not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v}")
    return v


class SettingsPart(BaseModel):
    """A group of settings that several verbs share, composed into their configs."""

    model_config = ConfigDict(extra="forbid")


class ConfigFile(Protocol):
    """A verb's typed config as the report writers take it: ``to_file()`` is what config.yaml
    holds, JSON-typed (the document's ``config``)."""

    def to_file(self) -> dict[str, JsonValue]: ...


class Figures(SettingsPart):
    """How the run's figures are written."""

    figure_format: FigureFormat = Field(
        None, description="Also write every figure as svg or pdf (next to its 200 dpi PNG)."
    )
