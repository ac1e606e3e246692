"""Tiny but exact models of every adapter family (random weights, reduced depth), built offline.

For tests of code that wraps ViTs (vitreg's own and users'): plain timm ViTs (:data:`TIMM_VITS`,
:func:`timm_vit`), timm Eva (:func:`eva_model`), Swin / PVT-v2 (:func:`hier_model`), HF
transformers vision models (:func:`hf_tiny`) and open_clip towers (:func:`open_clip_tower`).
Unlike :mod:`vitreg.testing.planted` nothing is planted: these pin the wrapping, not artifacts.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import timm
import torch
from torch import nn

from vitreg.models.load import load
from vitreg.models.model import Model


def _optional(name: str, extra: str) -> ModuleType:
    """The optional library ``name``, or an ImportError saying which extra installs it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(
            f"{name} is needed for this tiny model; pip install 'vitreg[{extra}]'"
        ) from e


def _images(b: int, size: int, seed: int = 0) -> torch.Tensor:
    """``b`` seeded random images ``[b, 3, size, size]``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, size, size, generator=g)


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


def timm_vit(key: str) -> tuple[nn.Module, int]:
    """The plain timm ViT ``key`` of :data:`TIMM_VITS` (seeded, eval mode, trained-like prefix
    tokens and LayerScale) and its input size."""
    arch, kwargs, size = TIMM_VITS[key]
    torch.manual_seed(0)
    module = timm.create_model(arch, pretrained=False, **kwargs).eval()
    return realistic_(module), size


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

_BUILT: dict[str, Model] = {}


def eva_model(key: str) -> tuple[Model, torch.Tensor]:
    """The Eva-family model for ``key`` (built once, with random weights that make every part
    matter) and two images of its size."""
    name, size = EVA_MODELS[key]
    if f"eva:{key}" not in _BUILT:
        torch.manual_seed(0)
        m = load(f"timm:{name}", pretrained=False, depth=2, img_size=size)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name_, p in m.module.named_parameters():
                leaf = name_.rsplit(".", 1)[-1]
                if leaf in ("cls_token", "reg_token", "q_bias", "v_bias"):
                    p.copy_(torch.randn(p.shape, generator=g))
                elif leaf in ("gamma_1", "gamma_2"):
                    p.fill_(1.0)
        _BUILT[f"eva:{key}"] = m
    return _BUILT[f"eva:{key}"], _images(2, size)


def hier_model(key: str) -> tuple[Model, torch.Tensor]:
    """The Swin / PVT-v2 model for ``key`` (built once) and two images of its size."""
    name, kwargs, size = HIER_MODELS[key]
    if f"hier:{key}" not in _BUILT:
        torch.manual_seed(0)
        _BUILT[f"hier:{key}"] = load(f"timm:{name}", pretrained=False, **kwargs)
    return _BUILT[f"hier:{key}"], _images(2, size)


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
    transformers = _optional("transformers", "hf")
    model_cls, config_cls, config = HF_KINDS[kind]
    torch.manual_seed(0)
    kwargs = {"attn_implementation": attn} if attn else {}
    config = getattr(transformers, config_cls)(**config)
    module = getattr(transformers, model_cls)._from_config(config, **kwargs).eval()
    for p in module.parameters():  # HF zero-inits registers and biases; make every token distinct
        p.data.add_(0.02 * torch.randn_like(p))
    return module


def hf_size(model: Model) -> int:
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
    _optional("open_clip", "openclip")
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
    """The tower's residual blocks on batch-first ``tokens``, in the layout the tower runs them."""
    seq_first = not tower.transformer.batch_first
    h = tokens.transpose(0, 1) if seq_first else tokens
    for blk in tower.transformer.resblocks:
        h = blk(h)
    return h.transpose(0, 1) if seq_first else h
