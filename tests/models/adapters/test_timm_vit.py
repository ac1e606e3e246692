"""timm VisionTransformer adapter: hook coverage, attention paths, edits, insertion."""

import pytest
import torch

import vitreg
from conftest import images
from vitreg import HookError
from vitreg.testing.tiny import TIMM_VITS, timm_vit

FAMILIES = list(TIMM_VITS)


@pytest.fixture(params=FAMILIES)
def family(request):
    module, size = timm_vit(request.param)
    return request.param, vitreg.wrap(module), size


def test_shapes_are_batch_first(family):
    _, model, size = family
    lay = model.layout_for((size, size))
    _, cache = model.run_with_cache(images(2, size))
    heads, d = model.n_heads, model.d_model
    assert cache["blocks.0.hook_resid_pre"].shape == (2, lay.n_tokens, d)
    assert cache["blocks.0.attn.hook_q"].shape == (2, lay.n_tokens, heads, d // heads)
    assert cache["blocks.0.attn.hook_v"].shape == (2, lay.n_tokens, heads, d // heads)
    assert cache["blocks.0.attn.hook_pattern"].shape == (2, heads, lay.n_tokens, lay.n_tokens)
    assert cache["blocks.0.mlp.hook_post"].shape == (2, lay.n_tokens, model.d_mlp)
    assert cache.layout("blocks.0.hook_resid_post") == lay


def test_recomputed_pattern_equals_unfused_probabilities(family):
    _, model, size = family
    x = images(2, size)
    names = "blocks.*.attn.hook_pattern"
    _, rec = model.run_with_cache(x, names=names)
    _, nat = model.run_with_cache(x, names=names, attention="native")
    for name in model.resolve(names):
        assert rec.attn_source[name] == "recomputed" and nat.attn_source[name] == "native"
        assert (rec[name] - nat[name]).abs().max() <= 1e-5
        assert torch.allclose(rec[name].sum(-1), torch.ones(()), atol=1e-5)
    # the fused flag is restored once the native hook is gone
    assert all(b.attn.fused_attn for b in model.module.blocks)


def test_pattern_native_when_source_is_unfused():
    module, size = timm_vit("dinov2")
    for blk in module.blocks:
        blk.attn.fused_attn = False
    model = vitreg.wrap(module)
    _, cache = model.run_with_cache(images(1, size), names="blocks.1.attn.hook_pattern")
    assert cache.attn_source["blocks.1.attn.hook_pattern"] == "native"
    assert "unfused" in model.adapter.attention_path()


def test_editing_mlp_units_changes_output_and_removal_restores():
    module, size = timm_vit("dinov2")
    model = vitreg.wrap(module)
    x = images(2, size)
    ref = model.features(x)

    def zero_units(t, hook):
        t = t.clone()
        t[..., :10] = 0
        return t

    edited = model.run_with_hooks(x, [("blocks.1.mlp.hook_post", zero_units)])
    assert (edited - ref).abs().max() > 1e-3
    assert torch.equal(model.features(x), ref)


def test_hook_v_write_equals_editing_the_value_projection():
    module, size = timm_vit("deit3")
    model = vitreg.wrap(module)
    x = images(1, size)

    def zero_v(t, hook):
        return torch.zeros_like(t)

    out = model.run_with_hooks(x, [("blocks.0.attn.hook_v", zero_v)])
    # with v = 0 the attention branch of block 0 adds only the proj bias
    _, cache = model.run_with_cache(x, names=["blocks.0.hook_resid_pre"])
    blk = module.blocks[0]
    mid = cache["blocks.0.hook_resid_pre"] + blk.ls1(blk.attn.proj.bias.expand(1, 1, -1))
    _, edited = model.run_with_cache(x, names=["blocks.0.hook_resid_mid"])
    with model.hooks([("blocks.0.attn.hook_v", zero_v)]):
        _, edited = model.run_with_cache(x, names=["blocks.0.hook_resid_mid"])
    assert torch.allclose(edited["blocks.0.hook_resid_mid"], mid, atol=1e-5)
    assert out.shape == model.features(x).shape


def test_recomputed_pattern_is_read_only_and_native_is_writable():
    module, size = timm_vit("dino")
    model = vitreg.wrap(module)
    x = images(1, size)

    def uniform(t, hook):
        return torch.full_like(t, 1.0 / t.shape[-1])

    with pytest.raises(HookError, match="attention='native'"):
        model.run_with_hooks(x, [("blocks.2.attn.hook_pattern", uniform)])
    ref = model.features(x)
    edited = model.run_with_hooks(x, [("blocks.2.attn.hook_pattern", uniform)], attention="native")
    assert (edited - ref).abs().max() > 1e-4


def test_replacement_with_wrong_shape_is_rejected():
    module, size = timm_vit("dino")
    model = vitreg.wrap(module)
    with pytest.raises(HookError, match="must keep"):
        model.run_with_hooks(images(1, size), [("blocks.0.hook_resid_post", lambda t, h: t[:, 1:])])


def test_unknown_hook_name_suggests_close_names():
    module, _ = timm_vit("dino")
    with pytest.raises(HookError, match="did you mean"):
        vitreg.wrap(module).resolve("blocks.0.hook_resid_pots")


def test_swiglu_neurons_are_the_gated_product():
    module, size = timm_vit("dinov2_swiglu")
    model = vitreg.wrap(module)
    assert model.d_mlp == module.blocks[0].mlp.fc2.in_features
    _, cache = model.run_with_cache(
        images(1, size), names=["blocks.0.mlp.hook_post", "blocks.0.ln2.hook_out"]
    )
    mlp = module.blocks[0].mlp
    x1, x2 = mlp.fc1(cache["blocks.0.ln2.hook_out"]).chunk(2, dim=-1)
    assert torch.allclose(cache["blocks.0.mlp.hook_post"], mlp.act(x1) * x2, atol=1e-5)


def test_hook_embed_is_the_patch_embedding_grid_and_writable():
    module, size = timm_vit("dinov2_reg4")
    model = vitreg.wrap(module)
    x = images(1, size)
    _, cache = model.run_with_cache(x, names=["hook_embed", "hook_tokens"])
    grid = cache["hook_embed"]
    lay = model.layout
    assert grid.shape == (1, *lay.grid, model.d_model)
    # hook_tokens = embedding + positions (no_embed_class: positions cover patches only)
    pos = module.pos_embed.reshape(1, *lay.grid, -1)
    assert torch.allclose(cache.patches("hook_tokens"), grid + pos, atol=1e-6)
    assert cache.layout("hook_embed").grid == lay.grid
    zeroed = model.run_with_hooks(x, [("hook_embed", lambda t, h: torch.zeros_like(t))])
    assert not torch.equal(zeroed, model.features(x))
