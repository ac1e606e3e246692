"""The model a verb runs and the images it runs on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PositiveInt, field_validator, model_validator

from vitreg.settings.base import (
    BATCH,
    DEFAULT_SPEC,
    SettingsPart,
    valid_device,
    valid_img_size,
    valid_weights_file,
)

EXCLUSIVE = "random_init and weights exclude each other; pass one of them"


class ModelSource(SettingsPart):
    """The model a verb runs: its spec and how it is built."""

    spec: str | None = Field(
        None, description=f"Model spec (default: the synthetic demo {DEFAULT_SPEC})."
    )
    img_size: PositiveInt | None = Field(
        None, description="Input size in pixels (passed as img_size where taken)."
    )
    random_init: bool = Field(
        False, description="Build the architecture with random weights (no download)."
    )
    weights: Path | None = Field(
        None,
        description="Weights file (.safetensors; or a torch state dict, read with "
        "weights_only=True) loaded strictly into SPEC's architecture instead of its pretrained "
        "weights; without --img-size the input size is the file's (a resampled position "
        "embedding is announced).",
    )
    device: str | None = Field(None, description="torch device, e.g. cpu or cuda:0.")

    _weights = field_validator("weights")(valid_weights_file)
    _device = field_validator("device")(valid_device)
    _size = field_validator("img_size")(valid_img_size)

    @model_validator(mode="before")
    @classmethod
    def _init_or_weights(cls, data: Any) -> Any:
        """Both given is the first thing said, before either is checked on its own."""
        if isinstance(data, dict) and data.get("random_init") is True and data.get("weights"):
            raise ValueError(EXCLUSIVE)
        return data

    @model_validator(mode="after")
    def _init_or_weights_parsed(self) -> ModelSource:
        if self.random_init and self.weights is not None:
            raise ValueError(EXCLUSIVE)
        return self


class ImageSet(SettingsPart):
    """The images a model verb runs on, and how many at a time."""

    images: Path | None = Field(
        None,
        description="Folder of images (searched recursively; bad files are skipped), or "
        "webdataset shards as wds:PATTERN (e.g. wds:/data/train-{0000..0099}.tar).",
    )
    samples: bool = Field(False, description="Use the photos bundled with scikit-image.")
    limit: PositiveInt | None = Field(None, description="Use at most N images.")
    batch_size: int = BATCH

    @model_validator(mode="after")
    def _images_or_samples(self) -> ImageSet:
        if self.images is not None and self.samples:
            raise ValueError("images and samples exclude each other; pass one of them")
        return self
