"""Causal controls for test-time registers (Jiang et al. 2025, §3.2 and appendix):

- ``ablate``: zero the register neurons on every token, with no register to receive them (the
  paper shows this hurts: the outliers carried something);
- ``random_like``: as many random neurons from the same layers, for the same ablation;
- ``shift_to_patch``: the register rule with a chosen patch as the target instead of a new
  token -- the demonstration that these neurons decide where the outlier lands.
"""

from __future__ import annotations

import random

import torch

from vitreg.errors import InputError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import Handle, HookContext
from vitreg.models.model import Model


def ablate(model: Model, neurons: NeuronSet) -> Handle:
    """Zero ``neurons`` on every token (no register); remove with the handle."""
    neurons.check_fits(model)

    def zero(units: list[int]):
        def fn(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
            out = t.clone()
            out[..., units] = 0
            return out

        return fn

    hooks = [
        (hook_name(layer, "mlp.hook_post"), zero(us)) for layer, us in neurons.by_layer().items()
    ]
    return model.hooks(hooks)


def random_like(neurons: NeuronSet, d_mlp: int, seed: int = 0) -> NeuronSet:
    """The same number of neurons per layer, drawn at random (seeded) among the other units."""
    rng = random.Random(seed)
    layers: list[int] = []
    units: list[int] = []
    for layer, chosen in neurons.by_layer().items():
        pool = sorted(set(range(d_mlp)) - set(chosen))
        picked = rng.sample(pool, len(chosen))
        layers += [layer] * len(picked)
        units += picked
    return NeuronSet(
        layers,
        units,
        [0.0] * len(units),
        neurons.model_spec,
        neurons.model_family,
        neurons.n_layers,
        neurons.d_mlp,
        neurons.fingerprint,
        {"control": "random neurons", "seed": seed, "like": len(neurons)},
    )


def shift_to_patch(model: Model, neurons: NeuronSet, patch: int | tuple[int, int]) -> Handle:
    """Per image and neuron: the chosen patch takes the neuron's max over all tokens, every other
    token is zeroed. ``patch`` is a row-major patch index or a (row, col) pair."""
    neurons.check_fits(model)
    h, w = model.layout.grid
    index = patch[0] * w + patch[1] if isinstance(patch, tuple) else int(patch)
    if not 0 <= index < h * w:
        raise InputError(f"patch {patch} is outside the {h}x{w} patch grid")

    def move(units: list[int]):
        idx = torch.tensor(units)

        def fn(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
            target = hook.layout.patches.start + index
            peak = t[:, :, idx.to(t.device)].amax(dim=1)
            out = t.clone()
            out[:, :, idx] = 0
            out[:, target, idx] = peak
            return out

        return fn

    hooks = [
        (hook_name(layer, "mlp.hook_post"), move(us)) for layer, us in neurons.by_layer().items()
    ]
    return model.hooks(hooks)
