"""Token insertion on timm ViTs: equals a hand-built sequence; pooling/heads/intermediates ignore it."""

import pytest
import timm
import torch

import vitreg
from conftest import images
from vitreg import HookError, InputError
from vitreg.testing.tiny import realistic_, timm_vit


def hand_built(model, x, extra):
    """Assemble [prefix, extra, patches] before ``norm_pre`` (where trained registers enter) and
    run the pre-norm, the blocks and the final norm by hand."""
    m = model.module
    p = model.layout.n_source_prefix
    with torch.no_grad():
        tokens = m.patch_drop(m._pos_embed(m.patch_embed(x)))
        seq = torch.cat([tokens[:, :p], extra.expand(x.shape[0], -1, -1), tokens[:, p:]], dim=1)
        seq = m.norm_pre(seq)
        for blk in m.blocks:
            seq = blk(seq)
        return m.norm(seq)


@pytest.mark.parametrize("key", ["dinov2", "dinov2_reg4", "siglip", "clip_quickgelu", "deit3"])
def test_inserted_forward_equals_hand_built_reference(key):
    module, size = timm_vit(key)
    model = vitreg.wrap(module)
    x = images(2, size)
    extra = torch.randn(1, 3, model.d_model)
    ref = hand_built(model, x, extra)
    with model.insert_tokens(extra[0]), torch.no_grad():
        full = model.adapter.features(x)
        assert model.layout.n_extra == 3
        assert (full - ref).abs().max() <= 1e-5
        stripped = model.features(x)
    assert torch.equal(stripped, model.layout.with_extra(3).strip_extra(full))
    assert stripped.shape[1] == model.layout.n_tokens  # layout is back to no extras


def test_pooling_heads_and_intermediates_ignore_inserted_tokens():
    module, size = timm_vit("dinov2_reg4")
    module.reset_classifier(5, global_pool="avg")
    model = vitreg.wrap(module)
    x = images(2, size)
    with model.insert_tokens(2), torch.no_grad():
        feats = model.adapter.features(x)
        lay = model.layout
        pooled = module.forward_head(feats, pre_logits=True)
        assert torch.allclose(pooled, feats[:, lay.patches].mean(1), atol=1e-6)
        logits = model(x)
        assert logits.shape == (2, 5)
        inter = module.forward_intermediates(x, intermediates_only=True, return_prefix_tokens=True)
        spatial, prefix = inter[-1]
        assert spatial.shape == (2, model.d_model, *lay.grid)
        assert prefix.shape == (2, lay.n_prefix, model.d_model)
    assert module.num_prefix_tokens == 5  # restored


def test_token_pooling_reads_cls_and_registers_stay_put():
    module, size = timm_vit("dinov2_reg4")
    model = vitreg.wrap(module)
    x = images(1, size)
    with model.insert_tokens(1), torch.no_grad():
        feats = model.adapter.features(x)
        assert torch.equal(module.forward_head(feats, pre_logits=True), feats[:, 0])
        out, cache = model.run_with_cache(x, names=["blocks.0.hook_resid_pre"])
        lay = cache.layout("blocks.0.hook_resid_pre")
        assert lay.n_extra == 1 and lay.extra == slice(5, 6)
        assert torch.equal(cache["blocks.0.hook_resid_pre"][:, lay.extra], torch.zeros(1, 1, 384))
        assert cache.patches("blocks.0.hook_resid_pre").shape == (1, 4, 4, 384)


def test_dynamic_size_model_keeps_pos_embed_right_across_calls():
    torch.manual_seed(0)
    module = realistic_(
        timm.create_model(
            "vit_small_patch14_dinov2",
            pretrained=False,
            depth=2,
            img_size=56,
            dynamic_img_size=True,
        ).eval()
    )
    model = vitreg.wrap(module)
    a, b = images(1, 56), images(1, 70, seed=1)
    ref_a, ref_b = model.features(a), model.features(b)
    with model.insert_tokens(torch.zeros(1, model.d_model)) as handle:
        model.features(a)
        # the prefix count was bumped at norm_pre and must be reset before the next _pos_embed
        out_b = model.features(b)
        assert out_b.shape == ref_b.shape and model.layout.grid == (5, 5)
    assert handle is not None and module.num_prefix_tokens == 1
    assert torch.equal(model.features(a), ref_a)


def test_batched_values_and_errors():
    module, size = timm_vit("dino")
    model = vitreg.wrap(module)
    x = images(2, size)
    per_image = torch.randn(2, 1, model.d_model)
    with model.insert_tokens(per_image):
        _, cache = model.run_with_cache(x, names=["hook_tokens"])
        assert torch.equal(cache["hook_tokens"][:, 1:2], per_image)
        with pytest.raises(HookError, match="already inserted"):
            model.insert_tokens(1)
        with pytest.raises(InputError, match="batch 2"):
            model.features(images(3, size))
    with pytest.raises(InputError, match="768|384"):
        model.insert_tokens(torch.zeros(1, 7))
    with pytest.raises(InputError, match="at least one"):
        model.insert_tokens(0)


def test_zero_tokens_fully_masked_leave_original_tokens_unchanged():
    """Plumbing check from the reference: tokens nobody attends to change nothing else."""
    module, size = timm_vit("deit3")
    model = vitreg.wrap(module)
    x = images(2, size)
    ref = model.features(x)
    lay = model.layout.with_extra(2)

    def block_extra_keys(t, hook):
        t = t.clone()
        t[..., lay.extra] = 0
        return t / t.sum(-1, keepdim=True)

    with model.insert_tokens(torch.randn(2, model.d_model)):
        out = model.run_with_hooks(x, [("blocks.*.attn.hook_pattern", block_extra_keys)], "native")
    assert (out - ref).abs().max() <= 1e-5
