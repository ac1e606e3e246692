"""The block slider of report.html: per-layer norm (and attention) maps of the first images,
saved as figures/slider.json beside the figures and read back when a report is rendered again."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SliderMaps(BaseModel):
    """Maps of one layer: the patch grid, the clipped colour range and one map per image."""

    model_config = ConfigDict(extra="allow")

    grid: list[int]
    range: list[float]
    maps: list[list[float]]


class SliderLayer(BaseModel):
    """One stop of the slider: its label, hook site and what it shows, its norm maps and (where
    measured) the attention maps of the same block."""

    model_config = ConfigDict(extra="allow")

    label: str
    site: str
    where: str
    grid: list[int]
    range: list[float]
    maps: list[list[float]]
    attention: SliderMaps | None = None


class Slider(BaseModel):
    """The whole slider: colour map, the images (data URIs), one entry per layer, the attention
    query (None without attention maps) and the layer shown first."""

    model_config = ConfigDict(extra="allow")

    cmap: list[list[int]]
    images: list[str]
    layers: list[SliderLayer]
    attention: str | None = None
    start: int
