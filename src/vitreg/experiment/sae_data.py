"""The activations the SAE study reads: every image's patch tokens at one block's output, of the
raw model and of the same model under a fix, gathered in memory by ``Model.trace``.

:func:`gather` is the one place the study gets its tokens from; the study itself
(:mod:`vitreg.experiment.sae`) only sees the :class:`Activations` it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vitreg.errors import InputError
from vitreg.fix.base import Fix
from vitreg.hooks.names import hook_name
from vitreg.hooks.reducers import Reducer, as_tokens
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model

SITE = "hook_resid_post"


class PatchTokens(Reducer[torch.Tensor]):
    """Every image's patch tokens ``[n_images, P, C]`` at one site (float32, on CPU), in
    image order; inserted and prefix tokens are dropped through the site's layout."""

    def __init__(self, site: str) -> None:
        super().__init__(site)
        self._parts: dict[int, torch.Tensor] = {}

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        tokens = as_tokens(t)
        patches = tokens if ctx.layout is None else tokens[:, ctx.layout.patches]
        self._parts[image_offset] = patches.float().cpu()

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, PatchTokens)
        self._parts.update(other._parts)
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> torch.Tensor:
        if not self._parts:
            return torch.empty(0)
        return torch.cat([self._parts[k] for k in sorted(self._parts)])


@dataclass(frozen=True)
class Activations:
    """Patch tokens ``[n_images, P, C]`` of the raw and the fixed model on the same images, at
    ``site`` (block ``layer``'s output)."""

    raw: torch.Tensor
    fixed: torch.Tensor
    site: str
    layer: int


def resolve_layer(model: Model, layer: int | None) -> int:
    """The block index ``layer`` names (``None``: the second-to-last; negative counts from the
    end), or an :class:`InputError` naming the blocks the model has."""
    n = model.n_layers
    k = max(n - 2, 0) if layer is None else (layer + n if layer < 0 else layer)
    if not 0 <= k < n:
        raise InputError(f"--layer {layer}: {model.spec or 'this model'} has blocks 0..{n - 1}")
    return k


def trace_patches(
    model: Model, images: Any, site: str, layer: int, batch_size: int
) -> torch.Tensor:
    """The patch tokens of ``images`` at ``site`` (the run stops after block ``layer``)."""
    reducer = PatchTokens(site)
    model.trace(images, [reducer], batch_size=batch_size, stop_at_layer=layer + 1)
    return reducer.result()


def gather(
    model: Model, images: Any, layer: int | None, fix: Fix, batch_size: int = 32
) -> Activations:
    """The raw model's patch tokens at block ``layer``'s output on ``images`` (a tensor or an
    iterable of batches that can be read twice), and the same with ``fix`` applied."""
    k = resolve_layer(model, layer)
    site = hook_name(k, SITE)
    raw = trace_patches(model, images, site, k, batch_size)
    with fix.applied(model):
        fixed = trace_patches(model, images, site, k, batch_size)
    if raw.shape != fixed.shape:
        raise InputError(
            f"the fixed model gave {tuple(fixed.shape)} patch tokens at {site}, the raw one "
            f"{tuple(raw.shape)}; the images must be the same on both passes"
        )
    return Activations(raw, fixed, site, k)
