"""Published register-neuron sets shipped with vitreg, keyed by the model spec they belong to.

Each is a hub folder inside the package (``vitreg/neurons/sets/NAME``: the set plus a model card,
see :mod:`vitreg.neurons.hub`), read and checked like any other.

- ``timm:vit_large_patch14_dinov2.lvd142m``: the 45 neurons hard-coded for torch hub by the
  official test-time-registers code (``dinov2/hub/register_neurons.py``,
  ``LARGE_REGISTER_NEURONS``), blocks 12-17. The list carries no scores; its scores are the rank
  order of the published list (deeper layers first, as listed).
"""

from __future__ import annotations

from pathlib import Path

from vitreg.errors import VitregError
from vitreg.fix.neuron_set import NeuronSet

SETS = Path(__file__).resolve().parent / "sets"

BUILTIN = {"timm:vit_large_patch14_dinov2.lvd142m": "dinov2_vitl14_lvd142m"}


def builtin_folder(spec: str) -> Path:
    """The hub folder of the set shipped for ``spec``."""
    if spec not in BUILTIN:
        raise VitregError(
            f"no built-in neuron set for {spec!r} (built-in: {sorted(BUILTIN)}); pass a "
            "NeuronSet file from `vitreg neurons`, a hub set (hf:ORG/REPO), or no --neurons to "
            "discover them first"
        )
    return SETS / BUILTIN[spec]


def builtin_neurons(spec: str) -> NeuronSet:
    """The published neuron set for ``spec`` (e.g. ``timm:vit_large_patch14_dinov2.lvd142m``)."""
    from vitreg.neurons.hub import read_folder

    return read_folder(builtin_folder(spec))
