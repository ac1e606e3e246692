"""[CLS]/patch-specialised ViT variants on timm: registers, specialised blocks, attention bias.

Attributes load lazily, so ``import vitreg`` does not import timm; the ``vitreg_*`` timm model
names are registered when timm is imported (:mod:`vitreg.arch.autoregister`).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BiasAttention": "vitreg.arch.attention",
    "COMPONENTS": "vitreg.arch.config",
    "VariantConfig": "vitreg.arch.config",
    "TokenSplit": "vitreg.arch.split",
    "convert": "vitreg.arch.variant",
    "create_variant": "vitreg.arch.variant",
    "merge_streams": "vitreg.arch.variant",
    "ParamReport": "vitreg.arch.cost",
    "flop_report": "vitreg.arch.cost",
    "param_lines": "vitreg.arch.cost",
    "param_report": "vitreg.arch.cost",
    "MODEL_NAMES": "vitreg.arch.registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vitreg.arch' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
