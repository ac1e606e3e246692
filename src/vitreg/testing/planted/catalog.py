"""Every planted fixture by name: ``build(name)`` dispatches to the timm, HF and kinds builders."""

from __future__ import annotations

from torch import nn

from vitreg.testing.planted.planted import SPECS, build_timm
from vitreg.testing.planted.planted_hf import HF_FIXTURES, build_hf
from vitreg.testing.planted.planted_kinds import KINDS, build_kind
from vitreg.testing.planted.planted_pruning import DESCRIPTION as PRUNING
from vitreg.testing.planted.planted_pruning import build_pruning
from vitreg.testing.planted.truth import GroundTruth


def list_planted() -> dict[str, str]:
    """Planted fixture names with one-line descriptions."""
    return {
        **{name: spec.description for name, spec in SPECS.items()},
        **{name: fixture.description for name, fixture in HF_FIXTURES.items()},
        **{name: kind.description for name, kind in KINDS.items()},
        "pruning": PRUNING,
    }


def build(name: str, img_size: int = 224, seed: int = 0) -> tuple[nn.Module, GroundTruth]:
    """The planted fixture ``name`` at ``img_size`` px, deterministic in ``seed``, and its truth
    (a :class:`~.planted_kinds.KindTruth` for the ``kinds_*`` fixtures, a
    :class:`~.planted_pruning.PruningTruth` for ``pruning``); the module
    says its weights are planted (``vitreg_weights``), wherever it is wrapped or saved."""
    if name in HF_FIXTURES:
        module, truth = build_hf(name, img_size=img_size, seed=seed)
    elif name in KINDS:
        module, truth = build_kind(name, img_size=img_size, seed=seed)
    elif name == "pruning":
        module, truth = build_pruning(img_size=img_size, seed=seed)
    else:
        module, truth = build_timm(name, img_size=img_size, seed=seed)
    module.vitreg_weights = "planted"
    return module, truth
