"""Open-vocabulary segmentation settings: which protocol sets them (``--protocol``), the knobs
one benchmark is evaluated with, and the published entries they are read from."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vitreg.settings.base import SettingsPart

ProtocolName = Literal["shared", "published"]
PROTOCOLS: tuple[ProtocolName, ...] = ("shared", "published")


class OvSegProtocol(SettingsPart):
    """Which settings ov-seg evaluates each method with."""

    protocol: ProtocolName = Field(
        "shared",
        description="ov-seg: shared (every method with SCLIP's per-benchmark settings) or "
        "published (each fix method with its own repository's settings for the benchmark: "
        "logit scale, thresholds, crop and stride, short side, PAMR, class names; a method "
        "without published settings and the unfixed model keep the shared ones).",
    )


class OvSegSettings(BaseModel):
    """The knobs one benchmark is evaluated with (``slide_crop`` 0: the whole image at once)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    names: str = Field(description="class-name list, a file of ov_seg_classes/")
    short_side: int = Field(gt=0, description="images resized keeping aspect to this short side")
    logit_scale: float = Field(gt=0)
    prob_thd: float = Field(ge=0, le=1, description="below this top probability: background")
    area_thd: float | None = Field(
        None, ge=0, le=1, description="a foreground class under this share is dropped"
    )
    slide_crop: int = Field(ge=0, description="sliding-window crop in pixels (0: whole image)")
    slide_stride: int = Field(gt=0, description="sliding-window stride in pixels")
    pamr_steps: int = Field(0, ge=0)
    pamr_dilations: tuple[int, ...] = (8, 16)


class PublishedEntry(OvSegSettings):
    """One method's settings for one benchmark and where they are written."""

    attention: str = Field(description="the last-block attention the shipped evaluation runs")
    source: str = Field(pattern=r"^\S+/\S+@[0-9a-f]{7,40} \S", description="repo@commit path:lines")


class PublishedMethod(BaseModel):
    """One method's official repository and its entry per benchmark."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    paper: str
    attention_paper: str
    note: str | None = Field(None, description="where vitreg's fix differs from the shipped one")
    benchmarks: dict[str, PublishedEntry]


class PublishedProtocols(BaseModel):
    """The data file: method name -> its published settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    methods: dict[str, PublishedMethod]
