"""Tiny but exact models of every adapter family (random weights, reduced depth), built offline.

One place for the builders the adapter, insertion, fix and parity tests share: timm ViTs
(``timm_models``), timm Eva, Swin/PVT-v2, HF transformers vision models and open_clip towers.
"""

from __future__ import annotations

import pytest
import torch

import vitreg
from conftest import images

# timm Eva family: key -> (timm name, image size); depth=2 everywhere
EVA_MODELS = {
    "dinov3": ("vit_small_patch16_dinov3", 64),
    "dinov3_qkvb": ("vit_small_patch16_dinov3_qkvb", 64),
    "eva02_tiny": ("eva02_tiny_patch14_224", 56),
    "eva02_base": ("eva02_base_patch14_224", 56),
    "rope_mixed": ("vit_small_patch16_rope_mixed_224", 64),  # AttentionRope, rope per block
}

# hierarchical timm: key -> (timm spec, kwargs, image size)
HIER_MODELS = {
    "swin": (
        "swin_tiny_patch4_window7_224",
        dict(img_size=56, depths=(2, 2, 2, 2), embed_dim=48),
        56,
    ),
    "pvt": ("pvt_v2_b0", {}, 64),
    "swin_dynamic": (
        "swin_tiny_patch4_window7_224",
        dict(img_size=64, depths=(2, 2, 2, 2), embed_dim=48, dynamic_img_size=True),
        64,
    ),
}

_BUILT: dict[str, vitreg.Model] = {}


def eva_model(key: str) -> tuple[vitreg.Model, torch.Tensor]:
    """The Eva-family model for ``key`` (built once, with random weights that make every part
    matter) and two images of its size."""
    name, size = EVA_MODELS[key]
    if f"eva:{key}" not in _BUILT:
        torch.manual_seed(0)
        m = vitreg.load(f"timm:{name}", pretrained=False, depth=2, img_size=size)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name_, p in m.module.named_parameters():
                leaf = name_.rsplit(".", 1)[-1]
                if leaf in ("cls_token", "reg_token", "q_bias", "v_bias"):
                    p.copy_(torch.randn(p.shape, generator=g))
                elif leaf in ("gamma_1", "gamma_2"):
                    p.fill_(1.0)
        _BUILT[f"eva:{key}"] = m
    return _BUILT[f"eva:{key}"], images(2, size)


def hier_model(key: str) -> tuple[vitreg.Model, torch.Tensor]:
    """The Swin / PVT-v2 model for ``key`` (built once) and two images of its size."""
    name, kwargs, size = HIER_MODELS[key]
    if f"hier:{key}" not in _BUILT:
        torch.manual_seed(0)
        _BUILT[f"hier:{key}"] = vitreg.load(f"timm:{name}", pretrained=False, **kwargs)
    return _BUILT[f"hier:{key}"], images(2, size)


# HF transformers ---------------------------------------------------------------------------
HF_DINO = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=42, patch_size=14
)
HF_VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
    image_size=48, patch_size=16,
)  # fmt: skip


# kind -> (transformers model class, config class, config arguments); classes resolved lazily
HF_KINDS = {
    "dinov2": ("Dinov2Model", "Dinov2Config", HF_DINO),
    "dinov2_swiglu": ("Dinov2Model", "Dinov2Config", {**HF_DINO, "use_swiglu_ffn": True}),
    "dinov2_reg": (
        "Dinov2WithRegistersModel",
        "Dinov2WithRegistersConfig",
        {**HF_DINO, "num_register_tokens": 2},
    ),
    "dinov2_cls": ("Dinov2ForImageClassification", "Dinov2Config", {**HF_DINO, "num_labels": 3}),
    "dinov2_reg_cls": (
        "Dinov2WithRegistersForImageClassification",
        "Dinov2WithRegistersConfig",
        {**HF_DINO, "num_labels": 3},
    ),
    "clip": ("CLIPVisionModel", "CLIPVisionConfig", HF_VISION),
    "clip_proj": (
        "CLIPVisionModelWithProjection",
        "CLIPVisionConfig",
        {**HF_VISION, "projection_dim": 16},
    ),
    "clip_cls": (
        "CLIPForImageClassification",
        "CLIPConfig",
        {"vision_config": HF_VISION, "num_labels": 3},
    ),
    "siglip": ("SiglipVisionModel", "SiglipVisionConfig", HF_VISION),
    "siglip_cls": (
        "SiglipForImageClassification",
        "SiglipConfig",
        {"vision_config": HF_VISION, "num_labels": 3},
    ),
}


def hf_tiny(kind: str, attn: str | None = None) -> torch.nn.Module:
    """A tiny random transformers model of ``kind`` (eval mode, seeded)."""
    transformers = pytest.importorskip("transformers")
    model_cls, config_cls, config = HF_KINDS[kind]
    torch.manual_seed(0)
    kwargs = {"attn_implementation": attn} if attn else {}
    config = getattr(transformers, config_cls)(**config)
    module = getattr(transformers, model_cls)._from_config(config, **kwargs).eval()
    for p in module.parameters():  # HF zero-inits registers and biases; make every token distinct
        p.data.add_(0.02 * torch.randn_like(p))
    return module


def hf_size(model: vitreg.Model) -> int:
    """The square input side a wrapped HF model was configured for."""
    return model.adapter.default_image_size()[0]


# open_clip ---------------------------------------------------------------------------------
OPEN_CLIP_BASE = dict(width=64, layers=2, head_width=32, patch_size=8, image_size=32)
# key -> (vision config, quick_gelu, run the blocks sequence-first)
OPEN_CLIP_TOWERS = {
    "gelu": (OPEN_CLIP_BASE, False, False),
    "quickgelu": (
        {**OPEN_CLIP_BASE, "image_size": (32, 48), "ls_init_value": 0.5},
        True,
        False,
    ),
    "clipa": (
        {**OPEN_CLIP_BASE, "no_ln_pre": True, "pool_type": "avg", "final_ln_after_pool": True},
        False,
        False,
    ),
    "seq_first": (OPEN_CLIP_BASE, False, True),
}


def open_clip_tower(key: str) -> torch.nn.Module:
    """A tiny open_clip vision tower with every parameter perturbed away from its init."""
    pytest.importorskip("open_clip")
    from open_clip.model import CLIPVisionCfg, _build_vision_tower

    cfg, quick, seq_first = OPEN_CLIP_TOWERS[key]
    torch.manual_seed(0)
    tower = _build_vision_tower(16, CLIPVisionCfg(**cfg), quick_gelu=quick).eval()
    with torch.no_grad():
        for p in tower.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if seq_first:  # how older open_clip ran its blocks: [N, B, C]
        tower.transformer.batch_first = False
        for blk in tower.transformer.resblocks:
            blk.attn.batch_first = False
    return tower


def open_clip_images(tower: torch.nn.Module, b: int = 2) -> torch.Tensor:
    """``b`` seeded images of the tower's (possibly non-square) input size."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(b, 3, *tower.image_size, generator=g)


def embeds_before_ln_pre(tower: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``[CLS, patches]`` with positions, as ``ln_pre`` receives them (read off ``_embeds``)."""
    seen = []
    handle = tower.ln_pre.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        tower._embeds(x)
    finally:
        handle.remove()
    return seen[0]


def run_blocks(tower: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    seq_first = not tower.transformer.batch_first
    h = tokens.transpose(0, 1) if seq_first else tokens
    for blk in tower.transformer.resblocks:
        h = blk(h)
    return h.transpose(0, 1) if seq_first else h
