"""Inserted tokens enter before the pre-norm (timm ``norm_pre``, HF ``pre_layrnorm``, open_clip
``ln_pre``), where trained registers enter and where the official test-time-registers code appends
its zero token: on CLIP-style models a zero register reaches block 0 as ``norm_pre(0)`` (the
LayerNorm bias), not as zeros. Towers without a pre-norm (DINOv2, SigLIP) are unchanged."""

from __future__ import annotations

import pytest
import timm
import torch
from torch import nn

import vitreg
from conftest import images
from vitreg.testing.tiny import (
    embeds_before_ln_pre,
    hf_tiny,
    open_clip_images,
    open_clip_tower,
    run_blocks,
)
from vitreg.testing.tiny import timm_vit as timm_build

K = 2  # inserted tokens in the hand-built comparisons


def randomize_norm_(norm: nn.Module, seed: int) -> torch.Tensor:
    """Seeded random LayerNorm weight and a clearly non-zero bias; returns the bias."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(norm.weight.shape, generator=g))
        norm.bias.copy_(torch.randn(norm.bias.shape, generator=g))
    assert norm.bias.abs().max() > 0.5
    return norm.bias.detach().clone()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def register_at_block0(model: vitreg.Model, x: torch.Tensor, values) -> torch.Tensor:
    """The inserted tokens as block 0 receives them (``blocks.0.hook_resid_pre``), ``[B, k, C]``."""
    with model.insert_tokens(values):
        _, cache = model.run_with_cache(x, names=["hook_tokens", "blocks.0.hook_resid_pre"])
    name = "blocks.0.hook_resid_pre"
    assert torch.equal(cache["hook_tokens"], cache[name])
    return cache[name][:, cache.layout(name).extra]


# timm ---------------------------------------------------------------------------------------------
def timm_clip() -> nn.Module:
    """The timm OpenAI-CLIP architecture (norm_pre LayerNorm, QuickGELU) at toy width/depth."""
    torch.manual_seed(0)
    module = timm.create_model(
        "vit_base_patch16_clip_quickgelu_224",
        pretrained=False,
        num_classes=0,
        depth=2,
        img_size=32,
        embed_dim=64,
        num_heads=2,
    ).eval()
    return randomized_prefix_and_pre_norm_(module)


def randomized_prefix_and_pre_norm_(module: nn.Module) -> nn.Module:
    """A seeded random [CLS] token and pre-norm, so a zero register is visibly not zero."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        module.cls_token.copy_(torch.randn(module.cls_token.shape, generator=g))
    randomize_norm_(module.norm_pre, seed=2)
    return module


def timm_pe_core() -> nn.Module:
    """A timm ``Eva`` with ``use_pre_transformer_norm`` (Perception Encoder: rope, map pooling)."""
    torch.manual_seed(0)
    module = timm.create_model(
        "vit_pe_core_tiny_patch16_384", pretrained=False, num_classes=0, depth=2, img_size=32
    ).eval()
    return randomized_prefix_and_pre_norm_(module)


@pytest.mark.parametrize("build", [timm_clip, timm_pe_core], ids=["clip", "pe_core_eva"])
def test_timm_zero_register_reaches_block0_as_norm_pre_of_zero(build) -> None:
    module = build()
    model = vitreg.wrap(module)
    x = images(2, 32)
    bias = module.norm_pre.bias.detach()
    with torch.no_grad():
        expected = module.norm_pre(torch.zeros(1, 1, model.d_model))
    assert max_diff(expected[0, 0], bias) <= 1e-6  # LayerNorm(0) is its bias
    seen = register_at_block0(model, x, 1)
    assert seen.shape == (2, 1, model.d_model)
    assert max_diff(seen, expected.expand(2, -1, -1)) <= 1e-5
    assert seen.abs().max() > 0.5  # not the zeros the old (after norm_pre) insertion produced
    values = torch.randn(K, model.d_model, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        normed = module.norm_pre(values)
    assert max_diff(register_at_block0(model, x, values), normed.expand(2, -1, -1)) <= 1e-5


def test_timm_clip_forward_equals_hand_built_sequence() -> None:
    module = timm_clip()
    model = vitreg.wrap(module)
    x = images(2, 32)
    p = model.layout.n_source_prefix
    zeros = torch.zeros(2, K, model.d_model)
    with torch.no_grad():
        emb = module.patch_drop(module._pos_embed(module.patch_embed(x)))
        seq = module.norm_pre(torch.cat([emb[:, :p], zeros, emb[:, p:]], dim=1))
        inter = []
        for blk in module.blocks:
            seq = blk(seq)
            inter.append(seq)
        ref = module.norm(seq)

    with model.insert_tokens(K), torch.no_grad():
        lay = model.layout
        full = model.adapter.features(x)
        assert full.shape == ref.shape
        assert max_diff(full, ref) <= 1e-5
        assert max_diff(model.features(x), lay.strip_extra(ref)) <= 1e-5
        # pooling ([CLS] token) and forward_intermediates skip the inserted tokens
        assert max_diff(module(x), module.forward_head(ref)) <= 1e-5
        taken = module.forward_intermediates(x, intermediates_only=True, return_prefix_tokens=True)
        for (spatial, prefix), want in zip(taken, inter, strict=True):
            assert spatial.shape == (2, model.d_model, *lay.grid)
            assert prefix.shape == (2, p + K, model.d_model)
            assert max_diff(spatial, lay.patch_grid(want).permute(0, 3, 1, 2)) <= 1e-5
    assert module.num_prefix_tokens == p and model.layout.n_extra == 0


def test_timm_eva_pre_norm_forward_equals_hand_built_sequence() -> None:
    module = timm_pe_core()
    model = vitreg.wrap(module)
    assert model.family == "timm-eva"
    x = images(2, 32)
    p = model.layout.n_source_prefix
    zeros = torch.zeros(2, K, model.d_model)
    with torch.no_grad():
        emb, rope = module._pos_embed(module.patch_embed(x))
        # the inserted tokens have no position: identity rotation rows (sin 0, cos 1)
        half = rope.shape[-1] // 2
        still = torch.cat([torch.zeros(K, half), torch.ones(K, half)], dim=-1)
        seq = module.norm_pre(torch.cat([emb[:, :p], zeros, emb[:, p:]], dim=1))
        for blk in module.blocks:
            seq = blk(seq, rope=torch.cat([still, rope], dim=0))
        ref = module.norm(seq)

    with model.insert_tokens(K), torch.no_grad():
        full = model.adapter.features(x)
        assert max_diff(full, ref) <= 1e-5
        assert max_diff(module(x), module.forward_head(ref)) <= 1e-5  # map pool reads all tokens
    assert module.num_prefix_tokens == p
    assert all(b.attn.num_prefix_tokens == p for b in module.blocks)


# HF CLIP --------------------------------------------------------------------------------------------
def test_hf_clip_register_enters_before_pre_layrnorm() -> None:
    module = hf_tiny("clip")
    model = vitreg.wrap(module)
    tower = model.adapter.tower
    bias = randomize_norm_(tower.pre_layrnorm, seed=4)
    x = images(2, 48)
    seen = register_at_block0(model, x, 1)
    assert max_diff(seen, bias.expand(2, 1, -1)) <= 1e-5

    lay = model.layout.with_extra(K)
    src = lay.with_extra(0)
    with torch.no_grad():
        emb = tower.embeddings(x)
        zeros = torch.zeros(2, K, model.d_model)
        h = tower.pre_layrnorm(torch.cat([emb[:, src.prefix], zeros, emb[:, src.patches]], 1))
        for layer in model.adapter.layers:
            h = layer(h, None)
        ref = lay.strip_extra(h)
        pooled = tower.post_layernorm(ref[:, 0])
    with model.insert_tokens(K), torch.no_grad():
        out = module(x)
        feats = model.features(x)
    assert max_diff(feats, ref) <= 1e-5
    assert max_diff(out.last_hidden_state, ref) <= 1e-5
    assert max_diff(out.pooler_output, pooled) <= 1e-5


# open_clip ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["gelu", "seq_first"])
def test_open_clip_register_enters_before_ln_pre(key: str) -> None:
    tower = open_clip_tower(key)
    model = vitreg.wrap(tower)
    bias = randomize_norm_(tower.ln_pre, seed=5)
    x = open_clip_images(tower)
    seen = register_at_block0(model, x, 1)
    assert max_diff(seen, bias.expand(2, 1, -1)) <= 1e-5

    lay = model.layout.with_extra(K)
    with torch.no_grad():
        tokens = torch.zeros(2, lay.n_tokens, model.d_model)
        tokens[:, lay.source_indices()] = embeds_before_ln_pre(tower, x)
        final = run_blocks(tower, tower.ln_pre(tokens))
        ref = tower.ln_post(lay.strip_extra(final))
        ref_pooled = tower._pool(lay.strip_extra(final))[0] @ tower.proj
    with model.insert_tokens(K), torch.no_grad():
        _, cache = model.run_with_cache(x, names="blocks.1.hook_resid_post")
        feats = model.features(x)
        pooled = tower(x)
    assert max_diff(cache["blocks.1.hook_resid_post"], final) <= 1e-5
    assert max_diff(feats, ref) <= 1e-5
    assert max_diff(pooled, ref_pooled) <= 1e-5


# no pre-norm: unchanged ---------------------------------------------------------------------------
def no_pre_norm_model(key: str) -> tuple[vitreg.Model, torch.Tensor]:
    if key.startswith("hf_"):
        model = vitreg.wrap(hf_tiny(key[3:]))
        return model, images(2, model.adapter.default_image_size()[0])
    if key == "open_clip_clipa":  # no_ln_pre: ln_pre is Identity
        tower = open_clip_tower("clipa")
        return vitreg.wrap(tower), open_clip_images(tower)
    module, size = timm_build(key)
    assert isinstance(module.norm_pre, nn.Identity)
    return vitreg.wrap(module), images(2, size)


@pytest.mark.parametrize(
    "key", ["dinov2_reg4", "siglip", "hf_dinov2_reg", "hf_siglip", "open_clip_clipa"]
)
def test_without_pre_norm_the_register_enters_block0_unchanged(key: str) -> None:
    model, x = no_pre_norm_model(key)
    values = torch.randn(K, model.d_model, generator=torch.Generator().manual_seed(6))
    assert torch.equal(register_at_block0(model, x, 1), torch.zeros(2, 1, model.d_model))
    assert torch.equal(register_at_block0(model, x, values), values.expand(2, -1, -1))


def test_dinov2_outputs_equal_insertion_at_block0() -> None:
    """DINOv2 (norm_pre Identity): the result is the old insertion at block 0's input."""
    module, size = timm_build("dinov2_reg4")
    model = vitreg.wrap(module)
    x = images(2, size)
    p = model.layout.n_source_prefix
    _, cache = model.run_with_cache(x, names="hook_tokens")
    tokens = cache["hook_tokens"]
    with torch.no_grad():
        seq = torch.cat([tokens[:, :p], torch.zeros(2, K, model.d_model), tokens[:, p:]], dim=1)
        for blk in module.blocks:
            seq = blk(seq)
        ref = module.norm(seq)
    with model.insert_tokens(K), torch.no_grad():
        assert torch.equal(model.adapter.features(x), ref)
