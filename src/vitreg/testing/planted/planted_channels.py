"""A channel-outlier plant for RF-CLIP: the planted CLIP whose register neurons write only into
a few fixed residual channels, so its flat patches become "distraction tokens" over-activated in
exactly those channels from the first planted block on (RF-CLIP's dimension-specific
over-activation, with a known answer).

The fixture is :func:`~vitreg.testing.planted.planted.build_timm`'s (same flat-patch rule,
same units); only the planted units' output columns change: each keeps its norm and points
evenly (and positively) into ``channels``. The plant's other channels stay as the random
initialisation left them, the background against which the share rule must tell them apart.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vitreg.errors import InputError
from vitreg.testing.planted.planted import SPECS, _plan, build_timm
from vitreg.testing.planted.truth import GroundTruth, TruthModel

CHANNELS = (4, 162, 474)  # RF-CLIP's distraction channels of CLIP ViT-B/16


class ChannelTruth(TruthModel):
    """Where the channel plant put its distraction tokens: the base fixture's truth (its flat
    rule selects the tokens), the channels they are over-activated in, and the first block whose
    input (``hook_resid_pre``) carries them."""

    base: GroundTruth
    channels: tuple[int, ...]
    first_layer: int

    def distraction_mask(self, images: torch.Tensor) -> torch.Tensor:
        """Bool ``[B, h, w]``: the patches of preprocessed ``images`` planted as distraction
        tokens."""
        return self.base.outlier_mask(images)

    def ambiguous_mask(self, images: torch.Tensor, band: float = 0.05) -> torch.Tensor:
        """Patches near the flat rule's threshold, where the plant's ramp is partial."""
        return self.base.ambiguous_mask(images, band)


def build_channel_plant(
    name: str = "clip_b16",
    channels: tuple[int, ...] = CHANNELS,
    img_size: int = 224,
    seed: int = 0,
) -> tuple[nn.Module, ChannelTruth]:
    """The planted timm fixture ``name`` with its planted writes moved into ``channels``."""
    module, base = build_timm(name, img_size=img_size, seed=seed)
    spec = SPECS[name]
    d = module.embed_dim
    plan = _plan(module, spec, torch.Generator().manual_seed(seed))  # build_timm's own plan
    taken = sorted(set(channels) & set(plan.reserved))
    if not channels or min(channels) < 0 or max(channels) >= d or taken:
        raise InputError(
            f"channels {channels} must be distinct indices < {d} outside the plant's reserved "
            f"channels (these collide: {taken})"
        )
    write = torch.zeros(d)
    write[list(channels)] = 1 / math.sqrt(len(channels))
    with torch.no_grad():
        for layer in spec.layers:
            fc2 = module.blocks[layer].mlp.fc2
            for j in plan.units[layer]:
                fc2.weight[:, j] = fc2.weight[:, j].norm() * write
    module.vitreg_weights = "planted"
    truth = ChannelTruth(base=base, channels=tuple(channels), first_layer=spec.layers[0] + 1)
    return module, truth
