"""What a unit writes into the residual stream, and the two rules of the causal selection read
from it.

A write is measured, not read off the weights: the block's MLP output with the unit's
activation set to 1 (every other unit at 0), less that with all at 0, so LayerScale, biases
and adapters' layouts are taken as the model runs them.

- **Off the outliers**: a write orthogonal to the outlier patches' residual raises their norm
  only at second order (``|x + r|^2 = |x|^2 + |r|^2``), so a unit that writes something else on
  those patches (one that co-fires with the writers) removes a little excess when zeroed, and the
  selection, chasing the last percent, can take it. A kept unit whose write's cosine with the
  outlier direction at its block (the outlier patches' mean residual less the ordinary ones')
  is under :data:`ALIGNED` of that of the block's best-aligned kept unit writes something else.
- **Siblings**: writers that compensate for each other share one write: zeroing some of them,
  the others carry it (LayerNorm hands them the room), so each one alone moves little and the
  selection, which keeps what the fix needs, leaves part of them out. A unit of a kept unit's
  block whose write points where that unit's does (cosine at least :data:`SIBLING_COS`), that
  fires on the outlier patches (at least :data:`SIBLING_ACT` of that unit's mean activation
  there) and keeps firing once the set is zeroed (not a reader) does the same job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, iter_batches

Unit = tuple[int, int]
SIBLING_COS = 0.8  # writes this close to a chosen unit's (cosine) do the same job; unrelated
# units' writes in a trained ViT-S lie within +-0.15 of each other
SIBLING_ACT = 0.25  # ... when the unit fires on the outlier patches at this share of its level
ALIGNED = 0.5  # a kept unit whose write aligns with its block's outlier direction below this
# share of the block's best-aligned kept unit's writes something else


def unit_writes(
    model: Model, units: Sequence[Unit], images: torch.Tensor
) -> dict[Unit, torch.Tensor]:
    """Each unit's write into the residual stream at unit activation (see :func:`block_writes`),
    ``images`` supplying the tokens: as many units a pass as their slots hold, one kept at 0."""
    writes: dict[Unit, torch.Tensor] = {}
    per_pass = len(images) * model.layout.n_tokens - 1
    for layer in sorted({layer for layer, _ in units}):
        here = [u for lay, u in units if lay == layer]
        for start in range(0, len(here), per_pass):
            part = here[start : start + per_pass]
            for u, w in zip(part, block_writes(model, layer, part, images), strict=True):
                writes[(layer, u)] = w
    return writes


def block_writes(model: Model, layer: int, units: list[int], images: torch.Tensor) -> torch.Tensor:
    """``[len(units), d]``: block ``layer``'s output less its MLP branch's input, with one
    token slot per unit whose post-activation is 1 (every other unit's 0), less the same with
    all at 0; ``images`` must hold ``len(units) + 1`` token slots."""
    n_images = math.ceil((len(units) + 1) / model.layout.n_tokens)
    seen: dict[str, torch.Tensor] = {}

    def one_hot(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
        slots = torch.zeros_like(t).flatten(0, 1)
        slots[torch.arange(len(units)), torch.tensor(units)] = 1  # the last slots stay at 0
        return slots.view_as(t)

    def keep(name: str):
        def fn(t: torch.Tensor, hook: HookContext) -> None:
            seen[name] = t.detach().flatten(0, 1).float()

        return fn

    hooks = [
        (hook_name(layer, "mlp.hook_post"), one_hot),
        (hook_name(layer, "hook_resid_mid"), keep("mid")),
        (hook_name(layer, "hook_resid_post"), keep("post")),
    ]
    with model.hooks(hooks), torch.no_grad():
        model.features(images[:n_images].to(model.device), stop_at_layer=layer + 1)
    out = seen["post"] - seen["mid"]
    return (out[: len(units)] - out[-1]).cpu()  # the last slot: every unit at 0 (the biases)


def sibling_matches(
    chosen: Sequence[Unit],
    rest: Sequence[Unit],
    writes: dict[Unit, torch.Tensor],
    acts: dict[int, torch.Tensor],
) -> dict[Unit, tuple[Unit, float]]:
    """For each unit of ``rest``: the chosen unit of its block whose write is closest to its
    own, and their cosine, where that is at least :data:`SIBLING_COS` and the unit's mean
    activation on the outlier patches (``acts``) at least :data:`SIBLING_ACT` of that unit's."""
    found = {}
    for u in rest:
        same = [c for c in chosen if c[0] == u[0]]
        if not same:
            continue
        cos = {c: float(torch.cosine_similarity(writes[u], writes[c], dim=0)) for c in same}
        best = max(cos, key=cos.__getitem__)
        level = float(acts[best[0]][best[1]])
        if cos[best] >= SIBLING_COS and float(acts[u[0]][u[1]]) >= SIBLING_ACT * level > 0:
            found[u] = (best, cos[best])
    return found


def outlier_directions(
    model: Model,
    images: torch.Tensor,
    masks: list[torch.Tensor],
    layers: Sequence[int],
    batch_size: int,
) -> dict[int, torch.Tensor]:
    """Per block of ``layers``: the outlier patches' mean residual at its output less the
    ordinary patches' (``masks``: per batch of ``images``, ``[B, N]`` outlier patches)."""
    sums = {k: [0.0, 0.0] for k in layers}  # outlier sum, ordinary sum
    counts = [0, 0]
    state: dict[str, torch.Tensor] = {}
    patches = model.layout.patches

    def keep(layer: int):
        def fn(t: torch.Tensor, hook: HookContext) -> None:
            on, off = state["on"], state["off"]
            t = t.detach().double().cpu()
            sums[layer][0] = sums[layer][0] + t[on].sum(0)
            sums[layer][1] = sums[layer][1] + t[off].sum(0)

        return fn

    hooks = [(hook_name(k, "hook_resid_post"), keep(k)) for k in layers]
    with model.hooks(hooks), torch.no_grad():
        for i, batch in enumerate(iter_batches(images, batch_size)):
            on = masks[i].cpu().clone()
            in_patches = torch.zeros_like(on)
            in_patches[:, patches] = True
            state["on"], state["off"] = on & in_patches, ~on & in_patches
            counts[0] += int(state["on"].sum())
            counts[1] += int(state["off"].sum())
            model.features(batch, stop_at_layer=max(layers) + 1)
    n_on, n_off = max(counts[0], 1), max(counts[1], 1)
    return {k: (v[0] / n_on - v[1] / n_off).float() for k, v in sums.items()}


def off_direction(
    kept: Sequence[Unit], writes: dict[Unit, torch.Tensor], directions: dict[int, torch.Tensor]
) -> dict[Unit, tuple[float, float]]:
    """The kept units that write something else than their block's outliers: for each, its
    write's cosine with the block's outlier direction and the best of the block's kept units."""
    cos = {u: float(torch.cosine_similarity(writes[u], directions[u[0]], dim=0)) for u in kept}
    off = {}
    for u in kept:
        best = max(cos[v] for v in kept if v[0] == u[0])
        if best > 0 and cos[u] < ALIGNED * best:
            off[u] = (cos[u], best)
    return off
