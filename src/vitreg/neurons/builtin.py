"""Published register-neuron sets shipped with vitreg, keyed by the model spec they belong to."""

from __future__ import annotations

from vitreg.errors import VitregError
from vitreg.fix.neuron_set import NeuronSet

# DINOv2 ViT-L/14 (LVD-142M): the 45 neurons hard-coded for torch hub by the official
# test-time-registers code (dinov2/hub/register_neurons.py, LARGE_REGISTER_NEURONS), layers 12-17.
# The list carries no scores; vitreg ranks them by listed order (deeper layers first, as listed).
_DINOV2_LARGE = {
    17: [
        884,
        133,
        1427,
        3464,
        2373,
        2436,
        841,
        3574,
        2129,
        3355,
        4047,
        3341,
        1330,
        4031,
        844,
        944,
        464,
    ],
    16: [2301, 3576, 1940, 3463, 1244, 407, 3152, 2517, 3465],
    15: [1714, 3507, 2492, 2680, 131, 720, 3499, 3062, 2625],
    14: [2110, 1510, 1082, 2711, 2464, 147, 543, 581],
    13: [2400],
    12: [3168],
}

BUILTIN = {
    "timm:vit_large_patch14_dinov2.lvd142m": dict(
        table=_DINOV2_LARGE,
        n_layers=24,
        d_mlp=4096,
        settings={
            "source": "official test-time-registers code, torch hub LARGE_REGISTER_NEURONS",
            "detect_layer": 22,
            "highest_layer": 17,
            "threshold": "absolute",
            "threshold_value": 150.0,
            "top_k": 45,
        },
    ),
}


def builtin_neurons(spec: str) -> NeuronSet:
    """The published neuron set for ``spec`` (e.g. ``timm:vit_large_patch14_dinov2.lvd142m``)."""
    if spec not in BUILTIN:
        raise VitregError(
            f"no built-in neuron set for {spec!r} (built-in: {sorted(BUILTIN)}); pass a "
            "NeuronSet file from `vitreg neurons`, or --neurons discover to find them first"
        )
    entry = BUILTIN[spec]
    pairs = [(layer, u) for layer, units in entry["table"].items() for u in units]
    n = len(pairs)
    return NeuronSet(
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        [float(n - i) for i in range(n)],  # rank order, not measured scores
        spec,
        "timm-vit",
        entry["n_layers"],
        entry["d_mlp"],
        None,
        {**entry["settings"], "scores": "rank order of the published list (no scores published)"},
        {"source": "published list"},
    )
