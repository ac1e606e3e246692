"""timm Eva adapter (DINOv3 (+qkvb), EVA-02 T and B, a rope ViT): sites, rope patterns, insertion."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import images
from vitreg.hooks.attention import softmax_pattern
from vitreg.models.adapters.timm_eva import TimmEvaAdapter
from vitreg.testing.tiny import EVA_MODELS, eva_model


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("key", EVA_MODELS)
def test_adapter_class_and_source_prefix(key: str) -> None:
    """Layout, names and sizes are in the adapter matrix; here what is Eva's own."""
    m, x = eva_model(key)
    assert isinstance(m.adapter, TimmEvaAdapter)
    assert m.module.num_prefix_tokens == m.layout.n_source_prefix
    assert m.n_layers == 2


@pytest.mark.parametrize("key", EVA_MODELS)
def test_native_routing_restores_every_flag(key: str) -> None:
    m, x = eva_model(key)
    with m.hooks([("*", lambda t, hook: None)], attention="native"), torch.no_grad():
        m.features(x)
    assert all(b.attn.fused_attn for b in m.module.blocks)
    assert not any(getattr(b.attn, "qkv_bias_separate", False) for b in m.module.blocks)


@pytest.mark.parametrize("key", EVA_MODELS)
def test_q_k_v_are_the_biased_projections_before_rope(key: str) -> None:
    m, x = eva_model(key)
    attn = m.module.blocks[1].attn
    assert isinstance(attn.q_norm, torch.nn.Identity)
    names = ["blocks.1.ln1.hook_out", *(f"blocks.1.attn.hook_{p}" for p in "qkv")]
    _, cache = m.run_with_cache(x, names=names)
    h = cache["blocks.1.ln1.hook_out"]
    with torch.no_grad():
        if attn.qkv is None:
            parts = [attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)]
        else:
            bias = attn.qkv.bias
            if getattr(attn, "q_bias", None) is not None:
                bias = torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
            parts = F.linear(h, attn.qkv.weight, bias).chunk(3, dim=-1)
    for p, part in zip("qkv", parts, strict=True):
        got = cache[f"blocks.1.attn.hook_{p}"]
        assert got.shape == (2, m.layout.n_tokens, attn.num_heads, attn.head_dim)
        assert max_diff(got, part.reshape(got.shape)) <= 1e-5


@pytest.mark.parametrize("key", EVA_MODELS)
def test_recomputed_pattern_matches_native(key: str) -> None:
    m, x = eva_model(key)
    names = ["blocks.*.attn.hook_pattern", "blocks.1.attn.hook_q", "blocks.1.attn.hook_k"]
    _, rec = m.run_with_cache(x, names=names)
    _, nat = m.run_with_cache(x, names="blocks.*.attn.hook_pattern", attention="native")
    n, heads = m.layout.n_tokens, m.n_heads
    for name in nat:
        assert rec.attn_source[name] == "recomputed" and nat.attn_source[name] == "native"
        assert rec[name].shape == (2, heads, n, n)
        assert max_diff(rec[name], nat[name]) <= 1e-5
        assert torch.allclose(rec[name].sum(-1), torch.ones(2, heads, n), atol=1e-5)
    # rope matters: the same q/k without rotation give another pattern
    q, k = (rec[f"blocks.1.attn.hook_{p}"].transpose(1, 2) for p in "qk")
    plain = softmax_pattern(q, k, m.module.blocks[1].attn.scale)
    assert max_diff(plain, rec["blocks.1.attn.hook_pattern"]) > 1e-4


@pytest.mark.parametrize("key", EVA_MODELS)
def test_mlp_hook_post_is_the_gated_hidden_unit(key: str) -> None:
    m, x = eva_model(key)
    mlp = m.module.blocks[0].mlp
    _, cache = m.run_with_cache(x, names=["blocks.0.ln2.hook_out", "blocks.0.mlp.hook_post"])
    h, post = cache["blocks.0.ln2.hook_out"], cache["blocks.0.mlp.hook_post"]
    with torch.no_grad():
        if hasattr(mlp, "fc1_g"):  # SwiGLU (EVA-02 B): the unit is before the MLP LayerNorm
            expected = mlp.act(mlp.fc1_g(h)) * mlp.fc1_x(h)
        elif key == "eva02_tiny":  # GluMlp: act(gate) * value, mlp.act alone is only the gate
            gate, value = mlp.fc1(h).chunk(2, dim=-1)
            expected = mlp.act(gate) * value
            assert max_diff(mlp.act(gate), post) > 1e-3
        else:
            expected = mlp.act(mlp.fc1(h))
    assert post.shape == (2, m.layout.n_tokens, m.d_mlp)
    assert max_diff(post, expected) <= 1e-5


@pytest.mark.parametrize("key", EVA_MODELS)
def test_write_through_mlp_hook_post_changes_output(key: str) -> None:
    m, x = eva_model(key)
    base = m.features(x)

    def zero_units(t: torch.Tensor, hook: object) -> torch.Tensor:
        t = t.clone()
        t[..., :16] = 0
        return t

    edited = m.run_with_hooks(x, [("blocks.0.mlp.hook_post", zero_units)])
    assert max_diff(edited, base) > 1e-4
    assert torch.equal(m.features(x), base)


@pytest.mark.parametrize("key", ["dinov3", "eva02_tiny"])
def test_insertion_matches_hand_built_reference(key: str) -> None:
    m, x = eva_model(key)
    mod, k = m.module, 2
    prefix = m.layout.n_source_prefix
    with torch.no_grad():
        base_features, base_out = m.features(x), mod(x)
    extra = torch.randn(k, m.d_model, generator=torch.Generator().manual_seed(2))

    # reference: embedded tokens + extra after the prefix, blocks run by hand with the same rope,
    # prepended by "no rotation" rows (sin 0, cos 1) so the attention's own prefix count stays put
    ropes = []
    grab = mod.blocks[0].register_forward_pre_hook(
        lambda _m, _a, kw: ropes.append(kw["rope"]), with_kwargs=True
    )
    _, cache = m.run_with_cache(x, names="hook_tokens")
    grab.remove()
    tokens, rope = cache["hook_tokens"], ropes[0]
    half = rope.shape[-1] // 2
    still = torch.cat([torch.zeros(k, half), torch.ones(k, half)], dim=-1)
    ref = torch.cat([tokens[:, :prefix], extra.expand(2, -1, -1), tokens[:, prefix:]], dim=1)
    inter = []
    with torch.no_grad():
        for blk in mod.blocks:
            ref = blk(ref, rope=torch.cat([still, rope], dim=0))
            inter.append(ref)
        ref = mod.norm(ref)

    with m.insert_tokens(extra):
        layout = m.layout
        assert layout.n_extra == k and layout.n_prefix == prefix + k
        with torch.no_grad():
            assert max_diff(m.adapter.features(x), ref) <= 1e-5
            assert max_diff(m.features(x), layout.strip_extra(ref)) <= 1e-5
            assert mod.num_prefix_tokens == prefix + k
            assert all(b.attn.num_prefix_tokens == prefix + k for b in mod.blocks)
            # intermediates (NCHW) and pooling see only the patches
            taken = mod.forward_intermediates(
                x, output_fmt="NCHW", intermediates_only=True, return_prefix_tokens=True
            )
            for (spatial, pre), full in zip(taken, inter, strict=True):
                assert spatial.shape == (2, m.d_model, *layout.grid)
                assert pre.shape == (2, prefix + k, m.d_model)
                assert max_diff(spatial, layout.patch_grid(full).permute(0, 3, 1, 2)) <= 1e-5
            assert mod.global_pool == "avg"
            pooled = mod.head(mod.fc_norm(ref[:, layout.patches].mean(1)))
            assert max_diff(mod(x), pooled) <= 1e-5
        _, seen = m.run_with_cache(x, names=["hook_tokens", "blocks.1.attn.hook_pattern"])
        assert torch.equal(layout.take(seen["hook_tokens"], "extra"), extra.expand(2, -1, -1))
        _, nat = m.run_with_cache(x, names="blocks.1.attn.hook_pattern", attention="native")
        pattern = seen["blocks.1.attn.hook_pattern"]
        assert pattern.shape[-1] == layout.n_tokens
        assert max_diff(pattern, nat["blocks.1.attn.hook_pattern"]) <= 1e-5

    assert mod.num_prefix_tokens == prefix and m.layout.n_extra == 0
    assert all(b.attn.num_prefix_tokens == prefix for b in mod.blocks)
    with torch.no_grad():
        assert torch.equal(m.features(x), base_features) and torch.equal(mod(x), base_out)


def test_dinov3_takes_dynamic_sizes() -> None:
    m, _ = eva_model("dinov3")
    for size in (48, 80):
        x = images(2, size)
        out, cache = m.run_with_cache(
            x, names=["blocks.1.hook_resid_post", "blocks.1.attn.hook_pattern"]
        )
        grid = (size // 16, size // 16)
        n = 5 + grid[0] * grid[1]
        assert m.layout.grid == grid and out.shape == (2, n, m.d_model)
        assert cache.layouts["blocks.1.hook_resid_post"].grid == grid
        assert cache["blocks.1.attn.hook_pattern"].shape == (2, m.n_heads, n, n)
