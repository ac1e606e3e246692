"""Small but exact timm ViT architectures (random weights, reduced depth) for the plain-ViT tests."""

from __future__ import annotations

import timm
import torch
from torch import nn

# name -> (timm architecture, constructor overrides, input size)
TIMM_VITS: dict[str, tuple[str, dict, int]] = {
    "dinov2": ("vit_small_patch14_dinov2", dict(depth=3, img_size=56), 56),
    "dinov2_reg4": ("vit_small_patch14_reg4_dinov2", dict(depth=3, img_size=56), 56),
    "dinov2_swiglu": (
        "vit_giant_patch14_dinov2",
        dict(depth=2, embed_dim=96, num_heads=4, img_size=56),
        56,
    ),
    "clip_quickgelu": ("vit_base_patch16_clip_quickgelu_224", dict(depth=2, img_size=64), 64),
    "siglip": ("vit_base_patch16_siglip_224", dict(depth=2, img_size=64), 64),
    "deit3": ("deit3_small_patch16_224", dict(depth=3, img_size=64), 64),
    "dino": ("vit_small_patch16_224", dict(depth=3, img_size=64), 64),
}


def realistic_(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give prefix tokens and LayerScale gammas trained-like magnitudes (timm inits them ~0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in ("cls_token", "reg_token") or name.endswith(("ls1.gamma", "ls2.gamma")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if "gamma" in name else 0))
    return module


def build(key: str) -> tuple[nn.Module, int]:
    arch, kwargs, size = TIMM_VITS[key]
    torch.manual_seed(0)
    module = timm.create_model(arch, pretrained=False, **kwargs).eval()
    return realistic_(module), size
