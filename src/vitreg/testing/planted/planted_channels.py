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
from vitreg.testing.planted.planted import build_timm
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
    if not channels or min(channels) < 0 or len(set(channels)) != len(channels):
        raise InputError(f"channels must be distinct indices >= 0, got {channels}")
    module, base = build_timm(name, img_size=img_size, seed=seed)
    d = module.embed_dim
    if max(channels) >= d:
        raise InputError(f"channels {channels}: all must be < the width {d} of {name}")
    # the plant's reserved channels only matter up to its first layer, so any channel will do
    write = torch.zeros(d)
    write[list(channels)] = 1 / math.sqrt(len(channels))
    with torch.no_grad():
        for layer, units in base.units_by_layer().items():
            fc2 = module.blocks[layer].mlp.fc2
            for j in units:
                fc2.weight[:, j] = fc2.weight[:, j].norm() * write
    module.vitreg_weights = "planted"
    truth = ChannelTruth(
        base=base, channels=tuple(channels), first_layer=base.first_outlier_layer + 1
    )
    return module, truth
