"""``vitreg.wrap(module)``: adapt a model object you already have, as ``vitreg.load`` would.

Apart from :mod:`vitreg.models.load` because a LLaVA model is wrapped by the ``hf-vlm`` loader
module, which itself builds on ``load``'s helpers.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from vitreg.models.loaders.hf_vlm import MODEL_TYPES, wrap_vlm
from vitreg.models.model import Model


def wrap(
    module: nn.Module,
    transform: Callable | None = None,
    spec: str | None = None,
    weights: str | None = None,
) -> Model:
    """Adapt a model object you already have (timm, HF, open_clip vision tower; for a
    transformers LLaVA model, its vision tower with the VLM as ``model.vlm``).

    ``weights`` says where its weights come from (a key of ``WEIGHT_KINDS``); by default what
    vitreg recorded when it loaded the module, "planted" for planted fixtures, else "user"."""
    if getattr(getattr(module, "config", None), "model_type", None) in MODEL_TYPES:
        model = wrap_vlm(module, spec=spec, transform=transform)
        if weights is not None:
            model.weights = weights
        return model
    return Model(module, spec=spec, transform=transform, weights=weights)
