"""The synthetic test images (textured content, flat regions of known extent) under the name
the planted fixtures and the data descriptions of runs use; they are made by
:mod:`vitreg.data.synthetic_images`."""

from __future__ import annotations

from vitreg.data.synthetic_images import (
    SyntheticImages,
    make_synthetic,
    synthetic_images,
    synthetic_pil,
    to_pil,
)

__all__ = ["SyntheticImages", "make_synthetic", "synthetic_images", "synthetic_pil", "to_pil"]
