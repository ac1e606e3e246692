"""vitreg.arch variants: options, token routing, gradients, no leaks, attention bias, timm names, wrap."""

import subprocess
import sys

import pytest
import timm
import torch
from torch import nn

import vitreg
from conftest import images
from vitreg import SpecError, UnsupportedModelError
from vitreg.arch import BiasAttention, TokenSplit, VariantConfig, create_variant
from vitreg.arch.registry import MODEL_NAMES

SMALL = dict(img_size=32, depth=3)  # vit_small_patch16_224 at 32 px: 4 patches


def small(**kw):
    kw = {"specialize": ("norm", "ls", "qkv"), "init_values": 1.0, **SMALL, **kw}
    return create_variant("vit_small_patch16_224", **kw).eval()


def splits(model, component):
    return [m for m in model.modules() if isinstance(m, TokenSplit) and m.component == component]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(register_stream="patch"), "needs registers"),
        (dict(qkv_blocks=4), "beyond the model's depth 3"),
        (dict(qkv_blocks=[0, 3]), "beyond the model's depth 3"),
        (dict(specialize=("norm", "attn")), "unknown component"),
        (dict(specialize=("norm",), qkv_blocks=2), "'qkv' is not in specialize"),
        (dict(pool="avg"), "no class token"),
        (dict(registers=2, register_stream="patch", pool="avg"), "no class token"),
        (dict(init_values=None), "has none"),
        (dict(final_norm="split", pool="avg", class_token=True), "fc_norm"),
        (dict(pool="max"), "pool must be one of"),
        (dict(registers=-1), "registers must be"),
        (dict(qkv_blocks="second_half"), "first_third"),
    ],
)
def test_bad_options_raise_spec_errors(kwargs, message):
    with pytest.raises(SpecError, match=message):
        small(**kwargs)


def test_unsupported_bases_and_instance_options():
    swin = timm.create_model(
        "swin_tiny_patch4_window7_224", embed_dim=24, depths=(1, 1), num_heads=(1, 2), img_size=56
    )
    with pytest.raises(UnsupportedModelError, match="VisionTransformer"):
        create_variant(swin)
    with pytest.raises(SpecError, match="timm.list_models"):
        create_variant("no_such_vit_xyz")
    vit = timm.create_model("vit_small_patch16_224", **SMALL, init_values=1.0)
    with pytest.raises(SpecError, match="name"):
        create_variant(vit, img_size=64)
    with pytest.raises(SpecError, match="register"):
        create_variant(vit, registers=2)
    with pytest.raises(SpecError, match="already a vitreg variant"):
        create_variant(create_variant(vit))


def test_structure_follows_the_options():
    m = small(registers=2, specialize=("norm", "ls", "qkv", "proj", "mlp"), proj_blocks=[-1])
    cfg = m.variant_config
    assert cfg.qkv_blocks == [0] and cfg.proj_blocks == [2] and cfg.mlp_blocks == [0]
    assert cfg.register_stream == "cls" and cfg.registers == 2 and cfg.pool == "token"
    assert len(splits(m, "norm")) == 6 and len(splits(m, "ls")) == 6
    assert isinstance(m.blocks[0].attn.qkv, TokenSplit) and isinstance(
        m.blocks[1].attn.qkv, nn.Linear
    )
    assert isinstance(m.blocks[2].attn.proj, TokenSplit)
    assert isinstance(m.blocks[0].mlp.fc1, TokenSplit) and isinstance(
        m.blocks[0].mlp.drop1, nn.Dropout
    )
    assert {s.n_global for s in m.modules() if isinstance(s, TokenSplit)} == {3}
    assert not isinstance(m.norm, TokenSplit)
    patch_stream = small(registers=2, register_stream="patch", final_norm="split")
    assert {s.n_global for s in splits(patch_stream, "norm")} == {1}
    assert isinstance(patch_stream.norm, TokenSplit)
    assert VariantConfig(specialize="norm").specialize == ("norm",)


@pytest.mark.parametrize("component", ["norm", "ls", "qkv", "final_norm"])
def test_each_token_goes_through_exactly_one_copy(component):
    m = small(registers=2, final_norm="split")
    wrapper = m.norm if component == "final_norm" else splits(m, component)[0]
    with torch.no_grad():
        for p in wrapper.glob.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(2, 7, m.embed_dim)
    out = wrapper(x)
    assert torch.allclose(out[:, :3], wrapper.glob(x[:, :3]), atol=1e-6)
    assert torch.allclose(out[:, 3:], wrapper.patch(x[:, 3:]), atol=1e-6)
    assert not torch.allclose(out[:, :3], wrapper.patch(x[:, :3]), atol=1e-3)


def test_both_copies_receive_gradients():
    m = small(registers=1, specialize=("norm", "ls", "qkv", "proj", "mlp"), final_norm="split")
    m.train()
    m.forward_features(images(2, 32)).square().mean().backward()  # every token counts
    wrappers = [s for s in m.modules() if isinstance(s, TokenSplit)]
    assert {s.component for s in wrappers} == {"norm", "ls", "qkv", "proj", "mlp", "final_norm"}
    for s in wrappers:
        for copy in (s.glob, s.patch):
            grads = [p.grad for p in copy.parameters()]
            assert all(g is not None and g.abs().sum() > 0 for g in grads), s
    assert all(
        p.grad is not None and p.grad.abs().sum() > 0
        for p in (m.blocks[0].norm1.glob.weight, m.blocks[0].norm1.patch.weight)
    )


def test_registers_and_bias_slots_never_leak_into_outputs():
    m = small(registers=2, attn_bias=True, num_classes=5)
    x = images(2, 32)
    logits, feats = m(x), m.forward_features(x)
    inter = m.forward_intermediates(
        x, indices=2, intermediates_only=True, return_prefix_tokens=True
    )
    assert logits.shape == (2, 5) and feats.shape == (2, 3 + 4, m.embed_dim)
    assert [(s.shape, p.shape) for s, p in inter] == [
        ((2, m.embed_dim, 2, 2), (2, 3, m.embed_dim))
    ] * 2
    with torch.no_grad():
        m.reg_token.add_(1.0)
        m.blocks[1].attn.k_bias.add_(1.0)
        m.blocks[1].attn.v_bias.add_(1.0)
    logits2 = m(x)
    assert logits2.shape == logits.shape and not torch.allclose(logits2, logits)
    gap = small(registers=2, register_stream="cls", pool="avg", attn_bias=True)
    assert gap.cls_token is None and gap.num_prefix_tokens == 2
    f = gap.forward_features(x)
    pooled = gap.forward_head(f, pre_logits=True)
    assert torch.allclose(pooled, gap.fc_norm(f[:, 2:].mean(1)), atol=1e-6)  # registers not pooled


def test_bias_attention_matches_a_direct_computation_fused_or_not():
    torch.manual_seed(1)
    attn = timm.layers.Attention(16, num_heads=2, qkv_bias=True).eval()
    plain = attn(x := torch.randn(2, 5, 16))
    ba = BiasAttention.from_attention(attn)
    assert ba.k_bias.shape == (1, 2, 1, 8) and 0.01 < ba.k_bias.std() < 0.04
    q, k, v = ba.qkv(x).reshape(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    k = torch.cat([ba.k_bias.expand(2, -1, -1, -1), k], 2)
    v = torch.cat([ba.v_bias.expand(2, -1, -1, -1), v], 2)
    want = ((q @ k.transpose(-1, -2)) * ba.scale).softmax(-1) @ v
    want = ba.proj(want.transpose(1, 2).reshape(2, 5, 16))
    mask = torch.rand(5, 5) > 0.3
    mask.fill_diagonal_(True)
    outs = {}
    for fused in (True, False):
        ba.fused_attn = fused
        outs[fused] = (ba(x), ba(x, attn_mask=mask), ba(x, is_causal=True))
        assert torch.allclose(outs[fused][0], want, atol=1e-6)
    for a, b in zip(outs[True], outs[False], strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert not torch.allclose(outs[True][0], plain, atol=1e-4)
    assert torch.allclose(ba.to_attention()(x), plain, atol=1e-6)
    assert type(attn) is timm.layers.Attention


def test_timm_names_accept_variant_options():
    assert set(timm.list_models("vitreg_*")) == set(MODEL_NAMES)
    m = timm.create_model(
        "vitreg_vit_small_patch16_224", registers=4, specialize=("norm", "ls"), **SMALL
    )
    assert m.num_prefix_tokens == 5 and len(splits(m, "ls")) == 6 and not splits(m, "qkv")
    assert m(images(1, 32)).shape == (1, 1000)
    loaded = vitreg.load(
        "timm:vitreg_vit_tiny_patch16_224", pretrained=False, attn_bias=True, **SMALL
    )
    assert isinstance(loaded.module.blocks[0].attn, BiasAttention)


@pytest.mark.slow  # a fresh interpreter importing torch and timm: ~5 s
def test_import_vitreg_stays_without_timm_and_registers_on_import():
    code = (
        "import sys, vitreg\nassert 'timm' not in sys.modules\n"
        "import timm\nprint(len(timm.list_models('vitreg_*')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(len(MODEL_NAMES)) and "Warning" not in out.stderr


def test_wrapped_variant_hooks_cache_and_analyses():
    torch.manual_seed(0)
    kw = dict(
        registers=2, attn_bias=True, specialize=("norm", "ls", "qkv", "mlp"), final_norm="split"
    )
    m = small(**kw)
    bare = timm.create_model("vit_small_patch16_224", reg_tokens=2, init_values=1.0, **SMALL)
    model = vitreg.wrap(m)
    assert model.hook_names() == vitreg.wrap(bare).hook_names()
    x = images(2, 32)
    names = ["blocks.*.attn.hook_pattern", "blocks.*.mlp.hook_post", "ln_final.hook_out"]
    out, cache = model.run_with_cache(x, names=names)
    assert (out - m.forward_features(x)).abs().max() <= 1e-5
    assert torch.allclose(cache["ln_final.hook_out"], out, atol=1e-6)
    _, native = model.run_with_cache(x, names=["blocks.*.attn.hook_pattern"], attention="native")
    assert cache.attn_source["blocks.0.attn.hook_pattern"] == "recomputed"
    assert native.attn_source["blocks.0.attn.hook_pattern"] == "native"
    assert m.blocks[0].attn.fused_attn  # restored after the native run
    for i in range(3):
        rec, nat = cache[f"blocks.{i}.attn.hook_pattern"], native[f"blocks.{i}.attn.hook_pattern"]
        assert rec.shape == (2, 6, 7, 7) and torch.allclose(rec, nat, atol=1e-6)
        assert (rec.sum(-1) < 1 - 1e-4).all()  # the slot takes the rest of each row
    from vitreg.analysis.ln_separation import ln_separation
    from vitreg.analysis.norms import norm_report

    sep = ln_separation(model, images(4, 32), batch_size=2)
    assert len(sep.summary.similarity) == 3 and "cls_patch" in sep.summary.similarity[0]["post_ln1"]
    trace = norm_report(model, images(4, 32), batch_size=2).trace
    assert trace.norms["blocks.2.hook_resid_post"].shape == (4, 7)
