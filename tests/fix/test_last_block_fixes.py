"""ClearCLIP, SCLIP and NACLIP: the last block equals a hand computation from the raw weights on
timm, open_clip and HF CLIP towers; a batch of 8 equals 8 single images; undefined models are
refused with the reason."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

import vitreg
from vitreg.errors import UnsupportedModelError
from vitreg.fix.clearclip import ClearCLIP
from vitreg.fix.naclip import NACLIP
from vitreg.fix.sclip import SCLIP
from vitreg.testing.tiny import hf_tiny, hier_model, open_clip_tower

FIXES = {"clearclip": ClearCLIP, "sclip": SCLIP, "naclip": NACLIP}


@functools.cache
def tiny(family: str) -> tuple[vitreg.Model, torch.Tensor]:
    """A tiny CLIP tower of ``family`` and 8 images of its size."""
    if family == "timm":
        torch.manual_seed(0)
        spec = "timm:vit_base_patch16_clip_quickgelu_224"
        m = vitreg.load(spec, pretrained=False, depth=2, embed_dim=32, num_heads=2, img_size=64)
        with torch.no_grad():
            for p in m.module.parameters():
                p.add_(0.05 * torch.randn_like(p))
    elif family == "hf":
        m = vitreg.wrap(hf_tiny("clip"))
    else:
        m = vitreg.wrap(open_clip_tower(family))
    size = m.adapter.default_image_size()
    return m, torch.randn(8, 3, *size, generator=torch.Generator().manual_seed(3))


def raw_weights(m: vitreg.Model):
    """(ln1, W_qkv, b_qkv, W_o, b_o, ln2, mlp, layer-scale gain) of the last block, read raw."""
    if m.family == "timm-vit":
        b = m.module.blocks[-1]
        mlp = b.mlp
        return (b.norm1, b.attn.qkv.weight, b.attn.qkv.bias, b.attn.proj.weight,
                b.attn.proj.bias, b.norm2, mlp, 1.0)  # fmt: skip
    if m.family == "open_clip-vit":
        b = m.module.transformer.resblocks[-1]
        gain = getattr(b.ls_1, "gamma", torch.tensor(1.0))
        return (b.ln_1, b.attn.in_proj_weight, b.attn.in_proj_bias, b.attn.out_proj.weight,
                b.attn.out_proj.bias, b.ln_2, lambda t: b.ls_2(b.mlp(t)), gain)  # fmt: skip
    b = m.adapter.layers[-1]
    a = b.self_attn
    w = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
    bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
    return b.layer_norm1, w, bias, a.out_proj.weight, a.out_proj.bias, b.layer_norm2, b.mlp, 1.0


def hand(name: str, m: vitreg.Model, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The published last block on its input ``x`` [B, N, C], written out from the raw weights."""
    ln1, w, bias, wo, bo, ln2, mlp, gain = raw_weights(m)
    heads = m.n_heads
    q, k, v = F.linear(ln1(x), w, bias).chunk(3, dim=-1)
    q, k, v = (t.unflatten(-1, (heads, -1)).transpose(1, 2) for t in (q, k, v))
    s = q.shape[-1] ** -0.5
    if name == "clearclip":
        a = torch.softmax(q @ q.transpose(-2, -1) * s, -1)
    elif name == "sclip":
        a = torch.softmax(q @ q.transpose(-2, -1) * s, -1) + torch.softmax(
            k @ k.transpose(-2, -1) * s, -1
        )
    else:
        n = x.shape[1]
        omega = torch.zeros(n, n)
        cells = [(i, j) for i in range(grid[0]) for j in range(grid[1])]
        for p, (i, j) in enumerate(cells):
            for r, (u, t) in enumerate(cells):  # [CLS] is token 0: its row and column stay 0
                omega[1 + p, 1 + r] = math.exp(-((i - u) ** 2 + (j - t) ** 2) / (2 * 5.0**2))
        a = torch.softmax(k @ k.transpose(-2, -1) * s + omega, -1)
    out = gain * F.linear((a @ v).transpose(1, 2).flatten(2), wo, bo)
    if name == "sclip":
        out = x + out
        out = out + mlp(ln2(out))
    return out


@pytest.mark.parametrize("family", ["timm", "gelu", "quickgelu", "seq_first", "hf"])
@pytest.mark.parametrize("name", list(FIXES))
def test_last_block_is_the_published_edit_and_batch_equals_singles(family, name):
    m, x = tiny(family)
    last = m.n_layers - 1
    pre, post = f"blocks.{last}.hook_resid_pre", f"blocks.{last}.hook_resid_post"
    bare = m.features(x)
    with torch.no_grad(), FIXES[name]().applied(m):
        _, cache = m.run_with_cache(x, names=[pre, post])
        fixed = m.features(x)
        singles = torch.cat([m.features(x[i : i + 1]) for i in range(len(x))])
    grid = cache.layout(pre).grid
    expected = hand(name, m, cache[pre], grid)
    assert torch.allclose(cache[post], expected, atol=1e-5, rtol=1e-4)
    assert (fixed - singles).abs().max() <= 1e-5
    assert (fixed - bare).abs().max() > 1e-3  # the fix changed the output
    assert torch.equal(m.features(x), bare)  # and is gone after the block


def test_hierarchical_and_rope_models_are_refused_with_the_reason():
    swin, _ = hier_model("swin")
    with pytest.raises(UnsupportedModelError, match="windows or stages"):
        NACLIP().apply(swin)
