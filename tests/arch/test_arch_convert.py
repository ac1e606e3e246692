"""Conversion keeps the source's function; parameter and FLOP reports match the arithmetic."""

import pytest
import timm
import torch

from conftest import images
from vitreg.arch import (
    VariantConfig,
    convert,
    create_variant,
    flop_report,
    merge_streams,
    param_lines,
    param_report,
)
from vitreg.arch.attention import BiasAttention
from vitreg.results.experiment import FlopCounts, FlopDeltas, ParamCounts
from vitreg.testing.tiny import timm_vit

ALL = ("norm", "ls", "qkv", "proj", "mlp")


def jitter_(model, seed=1):
    """Different weights in every tensor, so a copy that was not cloned would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


@pytest.mark.parametrize(
    "key, specialize",
    [("dinov2_reg4", ALL), ("deit3", ALL), ("clip_quickgelu", ("norm", "qkv", "proj", "mlp"))],
)
def test_converted_model_equals_its_source(key, specialize):
    src, size = timm_vit(key)
    jitter_(src)
    x = images(2, size)
    variant = convert(
        src, specialize=specialize, qkv_blocks="all", mlp_blocks=1, final_norm="split"
    )
    assert variant is not src and variant.variant_config.qkv_blocks == list(range(len(src.blocks)))
    with torch.no_grad():
        assert (variant(x) - src(x)).abs().max() <= 1e-5
        assert (variant.forward_features(x) - src.forward_features(x)).abs().max() <= 1e-5
        got = variant.forward_intermediates(x, norm=True, intermediates_only=True)
        want = src.forward_intermediates(x, norm=True, intermediates_only=True)
        assert max((a - b).abs().max() for a, b in zip(got, want, strict=True)) <= 1e-5
    assert not any(isinstance(m, BiasAttention) for m in src.modules())  # source untouched
    shared = merge_streams(variant)
    assert type(shared.blocks[0].norm1) is type(src.blocks[0].norm1)
    assert shared.state_dict().keys() == src.state_dict().keys()


def test_conversion_with_attention_bias_adds_a_slot_and_changes_outputs():
    src, size = timm_vit("dinov2_reg4")
    x = images(2, size)
    variant = create_variant(src, attn_bias=True)
    assert all(isinstance(b.attn, BiasAttention) for b in variant.blocks)
    with torch.no_grad():
        assert (variant(x) - src(x)).abs().max() > 1e-4
        bare = merge_streams(variant)
        assert (bare(x) - src(x)).abs().max() <= 1e-5


def test_param_report_matches_the_reference_table_for_vit_large_dinov2():
    base = VariantConfig("vit_large_patch14_dinov2", specialize=("norm", "ls"))
    small = param_report(base)  # built on the meta device
    assert isinstance(small, ParamCounts)
    assert small.baseline == 304_367_616
    assert small.extra["norm"] == 98_304 and small.extra["ls"] == 49_152
    assert 100 * small.extra_total / small.baseline == pytest.approx(0.048, abs=5e-4)
    full = param_report(base.with_(specialize=("norm", "ls", "qkv"), attn_bias=True, registers=4))
    assert full.extra["qkv"] == 8 * (3 * 1024 * 1024 + 3 * 1024)
    assert full.percent["qkv"] == pytest.approx(8.28, abs=0.01)
    assert full.extra["attn_bias"] == 24 * 2 * 1024
    assert full.extra["registers"] == 2 * 4 * 1024  # tokens and their pos_embed rows
    assert full.baseline == small.baseline
    assert param_lines(full)[-1].startswith("total")


def test_flops_equal_the_baseline_registers_and_bias_reported():
    kw = dict(img_size=28, depth=2)
    base = create_variant("vit_small_patch14_dinov2", specialize=(), **kw).eval()
    spec = create_variant("vit_small_patch14_dinov2", specialize=ALL, final_norm="split", **kw)
    report = flop_report(spec.eval())
    assert isinstance(report, FlopCounts)
    assert report.flops == flop_report(base).flops > 0
    assert report.delta == FlopDeltas(specialisation=0, attn_bias=0, registers=0)
    both = create_variant(
        "vit_small_patch14_dinov2", registers=2, attn_bias=True, specialize=ALL, **kw
    ).eval()
    r = flop_report(both)
    h, d = 6, 64
    assert r.tokens == 7 and r.registers == 2 and r.delta.specialisation == 0
    # the slot's key column in q k^T (its value enters as an elementwise p * v', not a matmul)
    assert r.delta.attn_bias == 2 * (2 * 7 * h * d)
    assert r.delta.registers > 0


def test_variant_state_dict_saves_and_loads_like_a_timm_model():
    vit = timm.create_model("deit3_small_patch16_224", img_size=32, depth=2).eval()
    variant = create_variant(vit, specialize=("norm", "ls"))
    x = images(1, 32)
    with torch.no_grad():
        assert (variant(x) - vit(x)).abs().max() <= 1e-5
    sd = variant.state_dict()
    assert "blocks.0.norm1.glob.weight" in sd and "blocks.0.norm1.patch.weight" in sd
    fresh = create_variant(
        "deit3_small_patch16_224", img_size=32, depth=2, specialize=("norm", "ls")
    )
    fresh.load_state_dict(sd)  # variants save and load like any timm model
    with torch.no_grad():
        assert torch.equal(fresh.eval()(x), variant(x))


def test_the_old_param_report_name_still_imports_with_a_warning():
    import vitreg.arch.cost as cost

    with pytest.warns(DeprecationWarning, match="ParamCounts"):
        assert cost.ParamReport is ParamCounts
