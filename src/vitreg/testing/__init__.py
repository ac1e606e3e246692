"""Shipped test fixtures: planted-artifact ViTs with ground truth and synthetic images.

Usable from users' own tests: ``build("dinov2_s14", img_size=112)`` returns a real timm model
whose register neurons and outlier tokens are known, and ``make_synthetic`` returns images with
known flat regions. ``random_circuit(arch, seed)`` draws one of a randomised family of planted
circuits (:mod:`vitreg.testing.planted.plant_family`). Importing this package registers the ``planted:`` model spec.
"""

from vitreg.testing import loader  # noqa: F401  (registers planted:)
from vitreg.testing.images import SyntheticImages, make_synthetic, synthetic_images, synthetic_pil
from vitreg.testing.planted import (
    FlatRule,
    GroundTruth,
    PositionRule,
    build,
    list_planted,
    random_circuit,
    random_unplanted,
)

__all__ = [
    "FlatRule",
    "GroundTruth",
    "PositionRule",
    "SyntheticImages",
    "build",
    "list_planted",
    "make_synthetic",
    "random_circuit",
    "random_unplanted",
    "synthetic_images",
    "synthetic_pil",
]
