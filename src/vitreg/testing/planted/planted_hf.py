"""Planted fixtures as Hugging Face transformers modules: a ``CLIPVisionModel`` (the LLaVA tower)
carrying the weights of a planted timm CLIP tower, converted exactly.

timm's CLIP tower and HF's ``CLIPVisionModel`` compute the same function (patch conv without
bias, [CLS] + positions, ``ln_pre``, pre-norm blocks with QuickGELU MLPs, eps 1e-5), so the
planted units, their ground truth and the outliers carry over unchanged: the fused ``qkv`` is
split into HF's ``q_proj``/``k_proj``/``v_proj``. timm's final ``norm`` becomes HF's
``post_layernorm`` (which HF applies to the pooled [CLS] only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitreg.testing.planted.planted import build_timm
from vitreg.testing.planted.truth import GroundTruth


@dataclass(frozen=True)
class HFFixture:
    """An HF fixture: the planted timm fixture it is converted from, and what it is."""

    twin: str
    description: str


HF_FIXTURES: dict[str, HFFixture] = {
    "hf_clip_t16": HFFixture(
        "clip_t16",
        "HF transformers CLIPVisionModel (LLaVA's tower class) with the weights of clip_t16: "
        "register neurons in layers 6-7 fire on flat patches",
    ),
}


def clip_vision_from_timm(module: nn.Module) -> nn.Module:
    """An HF ``CLIPVisionModel`` computing what the timm CLIP tower ``module`` computes."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    blocks = module.blocks
    d = int(module.embed_dim)
    patch = int(module.patch_embed.patch_size[0])
    grid = tuple(int(s) for s in module.patch_embed.grid_size)
    config = CLIPVisionConfig(
        hidden_size=d,
        intermediate_size=int(blocks[0].mlp.fc1.out_features),
        num_hidden_layers=len(blocks),
        num_attention_heads=int(blocks[0].attn.num_heads),
        image_size=grid[0] * patch,
        patch_size=patch,
        hidden_act="quick_gelu",
        layer_norm_eps=float(module.norm_pre.eps),
        attn_implementation="eager",
    )
    hf = CLIPVisionModel(config).eval()
    src = module.state_dict()
    state = {
        "embeddings.class_embedding": src["cls_token"].reshape(d),
        "embeddings.patch_embedding.weight": src["patch_embed.proj.weight"],
        "embeddings.position_embedding.weight": src["pos_embed"][0],
        "pre_layrnorm.weight": src["norm_pre.weight"],
        "pre_layrnorm.bias": src["norm_pre.bias"],
        "post_layernorm.weight": src["norm.weight"],
        "post_layernorm.bias": src["norm.bias"],
    }
    for i in range(len(blocks)):
        t, h = f"blocks.{i}.", f"encoder.layers.{i}."
        for kind in ("weight", "bias"):
            q, k, v = src[f"{t}attn.qkv.{kind}"].chunk(3, dim=0)
            state.update(
                {
                    f"{h}self_attn.q_proj.{kind}": q,
                    f"{h}self_attn.k_proj.{kind}": k,
                    f"{h}self_attn.v_proj.{kind}": v,
                    f"{h}self_attn.out_proj.{kind}": src[f"{t}attn.proj.{kind}"],
                    f"{h}layer_norm1.{kind}": src[f"{t}norm1.{kind}"],
                    f"{h}layer_norm2.{kind}": src[f"{t}norm2.{kind}"],
                    f"{h}mlp.fc1.{kind}": src[f"{t}mlp.fc1.{kind}"],
                    f"{h}mlp.fc2.{kind}": src[f"{t}mlp.fc2.{kind}"],
                }
            )
    missing = [k for k in hf.state_dict() if k not in state and not k.endswith("position_ids")]
    if missing:  # pragma: no cover - a transformers layout this converter does not know
        raise RuntimeError(f"CLIPVisionModel keys not converted: {missing[:5]}")
    with torch.no_grad():
        hf.load_state_dict(state, strict=False)
    return hf


def build_hf(name: str, img_size: int = 224, seed: int = 0) -> tuple[nn.Module, GroundTruth]:
    """The HF fixture ``name``: its timm twin built and converted; the twin's ground truth."""
    fixture = HF_FIXTURES[name]
    module, truth = build_timm(fixture.twin, img_size=img_size, seed=seed)
    hf = clip_vision_from_timm(module)
    config = {k: v for k, v in hf.config.to_dict().items() if isinstance(v, int | float | str)}
    named = {"name": name, "architecture": "transformers.CLIPVisionModel", "model_args": config}
    return hf, truth.model_copy(update=named)
