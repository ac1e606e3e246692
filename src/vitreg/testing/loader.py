"""``planted:NAME``: synthetic ViTs with planted register neurons (see vitreg.testing.planted),
registered with the model loaders when vitreg.testing is imported."""

from __future__ import annotations

import os
from typing import Any

from vitreg.errors import SpecError
from vitreg.models.load import LOADERS, Loaded
from vitreg.testing.planted import KINDS, build, build_kind
from vitreg.testing.planted.planted_pruning import DESCRIPTION, build_pruning


@LOADERS.register("planted")
def load_planted(
    name: str,
    pretrained: bool = True,
    weights: str | os.PathLike | None = None,
    img_size: int | None = None,
    seed: int = 0,
    **kwargs: Any,
) -> Loaded:
    """Build the planted fixture ``name``; its :class:`GroundTruth` is ``module.vitreg_planted``."""
    if weights is not None:
        raise SpecError(
            "planted models are built from a seed, not loaded from weights; to reload a saved "
            "planted model use 'local:DIR' (vitreg.models.loaders.local.save_local writes one)"
        )
    if kwargs:
        raise SpecError(f"planted:{name} takes only img_size and seed, got {sorted(kwargs)}")
    if name in KINDS:  # the artifact kinds' plants: no register neurons to discover or fix
        module, kind = build_kind(name, img_size=img_size or 64, seed=seed)
        module.vitreg_weights = "planted"
        module.vitreg_kind_truth = kind
        note = f"synthetic: {kind.description} (seed {seed}); random weights, not a trained model"
        return Loaded(module, notes=[note])
    if name == "pruning":  # a known token-pruning curve: no register neurons either
        module, pruning = build_pruning(img_size=img_size or 64, seed=seed)
        module.vitreg_weights = "planted"
        module.vitreg_pruning_truth = pruning
        note = f"synthetic: {DESCRIPTION} (seed {seed}); hand-set weights, not a trained model"
        return Loaded(module, notes=[note])
    module, truth = build(name, img_size=img_size or 224, seed=seed)
    module.vitreg_planted = truth

    def pairs(units) -> str:
        return ", ".join(f"{u[0]}:{u[1]}" for u in units)

    roles = f"; readers {pairs(truth.reader_units)} reinforce them" if truth.reader_units else ""
    if truth.distractor_units:
        kinds = ", ".join(
            f"{layer}:{unit} ({kind})" for layer, unit, kind in truth.distractor_units
        )
        roles += f"; distractors {kinds} do not touch them"
    note = (
        f"synthetic: planted register neurons on random weights ({name}, seed {seed}); causal "
        f"units {pairs(truth.causal_units)} write high-norm outliers into flat patches from "
        f"layer {truth.emergence_layer}{roles}. Not a trained model: use it to test tools, not "
        "to draw conclusions about real ViTs"
    )
    return Loaded(module, notes=[note])
