"""Training: supervised (DeiT III) and DINO/iBOT recipes, DDP, checkpoints with resume.

The names below load on first use, so that :mod:`vitreg.settings.train` (which the CLI's help is
built from) imports without torch."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {
    "DinoOptions": "vitreg.train.dino",
    "SupervisedOptions": "vitreg.train.supervised",
    "ResolvedTrainConfig": "vitreg.results.train",
    "TrainConfig": "vitreg.train.config",
    "TrainResult": "vitreg.train.loop",
    "TrainSettings": "vitreg.settings.train",
    "train": "vitreg.train.loop",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'vitreg.train' has no attribute {name!r}")
    return getattr(import_module(_HOMES[name]), name)
