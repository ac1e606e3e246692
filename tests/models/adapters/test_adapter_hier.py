"""Hierarchical timm adapters (Swin, PVT-v2): stage grids, windowed / reduced-key attention."""

from __future__ import annotations

import pytest
import torch

from conftest import images
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.models.adapters.timm_hier import TimmPvtV2Adapter, TimmSwinAdapter
from vitreg.testing.tiny import hier_model

STAGES = {  # key -> per-stage (grid side, channels); effective patch size is 4 * 2**s
    "swin": [(14, 48), (7, 96), (4, 192), (2, 384)],
    "pvt": [(16, 32), (8, 64), (4, 160), (2, 256)],
}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("key", ["swin", "pvt"])
def test_adapter_dims_and_final_layout(key: str) -> None:
    m, x = hier_model(key)
    cls = {"swin": TimmSwinAdapter, "pvt": TimmPvtV2Adapter}[key]
    assert isinstance(m.adapter, cls) and m.adapter.hierarchical and m.family == "timm-hier"
    assert not m.adapter.supports_insertion
    assert m.adapter.stage_depths == (2, 2, 2, 2) and m.n_layers == 8
    side, width = STAGES[key][-1]
    assert m.d_model == width
    assert m.features(x).shape == (2, side * side, width)
    layout = m.layout  # the final stage at the last input size
    assert (layout.n_cls, layout.n_reg, layout.grid, layout.patch_size) == (
        0,
        0,
        (side, side),
        (32, 32),
    )
    default = {"swin": (2, 2), "pvt": (7, 7)}[key]  # built for 56 px / timm's 224 px default
    assert m.adapter.base_layout().grid == default


@pytest.mark.parametrize("key", ["swin", "pvt"])
def test_features_are_the_cached_final_norm_and_flags_restored(key: str) -> None:
    m, x = hier_model(key)
    fused = [b.attn.fused_attn for s in m.adapter.stages() for b in s.blocks]
    out, cache = m.run_with_cache(x)
    assert len(cache) == len(m.hook_names())
    assert max_diff(out, m.adapter.features(x)) == 0.0
    assert fused == [b.attn.fused_attn for s in m.adapter.stages() for b in s.blocks]


@pytest.mark.parametrize("key", ["swin", "pvt"])
def test_stage_grids_and_layouts(key: str) -> None:
    m, x = hier_model(key)
    _, cache = m.run_with_cache(x)
    with torch.no_grad():
        inter = m.module.forward_intermediates(x, intermediates_only=True)
    for s, (side, width) in enumerate(STAGES[key]):
        stride = 4 * 2**s
        for name in [f"stages.{s}.hook_out", f"stages.{s}.blocks.1.hook_resid_mid"]:
            layout = cache.layouts[name]
            assert (layout.n_cls, layout.n_reg, layout.grid) == (0, 0, (side, side))
            assert layout.patch_size == (stride, stride)
            assert cache[name].shape == (2, side, side, width)
        # the stage output is what timm's own intermediates return (NCHW)
        assert torch.equal(cache[f"stages.{s}.hook_out"], inter[s].permute(0, 2, 3, 1))
    final = cache["ln_final.hook_out"]
    assert cache.layouts["ln_final.hook_out"] == m.layout
    assert torch.equal(final.flatten(1, 2), m.features(x))


def swin_window_pattern(blk: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Window attention of a Swin block by hand from its ln1 output (no padding needed)."""
    from timm.models.swin_transformer import window_partition

    if any(blk.shift_size):
        x = torch.roll(x, (-blk.shift_size[0], -blk.shift_size[1]), dims=(1, 2))
    win = window_partition(x, blk.window_size).flatten(1, 2)
    attn = blk.attn
    q, k, _ = attn.qkv(win).reshape(*win.shape[:2], 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)
    scores = (q * attn.scale) @ k.transpose(-2, -1) + attn._get_rel_pos_bias()
    if blk.attn_mask is not None:
        n_win = blk.attn_mask.shape[0]
        scores = scores.view(-1, n_win, *scores.shape[1:]) + blk.attn_mask[None, :, None]
        scores = scores.flatten(0, 1)
    return scores.softmax(-1)


def test_swin_window_pattern_is_native_and_matches_hand_computation() -> None:
    m, x = hier_model("swin")
    names = [
        f"stages.0.blocks.{j}.{s}" for j in (0, 1) for s in ("ln1.hook_out", "attn.hook_pattern")
    ]
    _, cache = m.run_with_cache(x, names=names)
    for j in (0, 1):  # block 1 is shifted and masked
        blk = m.module.layers[0].blocks[j]
        pattern = cache[f"stages.0.blocks.{j}.attn.hook_pattern"]
        assert cache.attn_source[f"stages.0.blocks.{j}.attn.hook_pattern"] == "native"
        assert pattern.shape == (2 * 4, 3, 49, 49)  # 14x14 grid -> 4 windows of 7x7, 3 heads
        assert torch.allclose(pattern.sum(-1), torch.ones(8, 3, 49), atol=1e-5)
        with torch.no_grad():
            by_hand = swin_window_pattern(blk, cache[f"stages.0.blocks.{j}.ln1.hook_out"])
        assert max_diff(pattern, by_hand) <= 1e-5


def test_swin_native_pattern_unfuses_only_while_hooked() -> None:
    m, x = hier_model("swin")
    attns = [b.attn for s in m.module.layers for b in s.blocks]
    _, unfused = m.run_with_cache(x, names="*.attn.hook_pattern")
    for a in attns:
        a.fused_attn = True
    try:
        _, cache = m.run_with_cache(x, names="*.attn.hook_pattern")
        assert all(a.fused_attn for a in attns)
        for name in unfused:
            assert max_diff(cache[name], unfused[name]) <= 1e-5
    finally:
        for a in attns:
            a.fused_attn = False


def test_pvt_recomputed_pattern_matches_native() -> None:
    m, x = hier_model("pvt")
    _, rec = m.run_with_cache(x, names="*.attn.hook_pattern")
    _, nat = m.run_with_cache(x, names="*.attn.hook_pattern", attention="native")
    kv_sides = [2, 2, 2, 2]  # 16/8, 8/4, 4/2, 2/1
    for (side, _), kv, s in zip(STAGES["pvt"], kv_sides, range(4), strict=True):
        name = f"stages.{s}.blocks.0.attn.hook_pattern"
        heads = m.module.stages[s].blocks[0].attn.num_heads
        assert rec.attn_source[name] == "recomputed" and nat.attn_source[name] == "native"
        assert rec[name].shape == (2, heads, side * side, kv * kv)
        assert torch.allclose(rec[name].sum(-1), torch.ones(2, heads, side * side), atol=1e-5)
        assert max_diff(rec[name], nat[name]) <= 1e-5
    assert all(b.attn.fused_attn for s in m.module.stages for b in s.blocks)


@pytest.mark.parametrize("key", ["swin", "pvt"])
def test_mlp_hook_post_is_the_activation_and_writes_change_output(key: str) -> None:
    m, x = hier_model(key)
    site = "stages.1.blocks.0.mlp.hook_post"
    mlp = m.adapter.stages()[1].blocks[0].mlp
    seen = []
    grab = mlp.act.register_forward_hook(lambda _m, _a, out: seen.append(out))
    calls = []
    try:
        m.run_with_hooks(x, [(site, lambda t, hook: calls.append(t.clone()))])
    finally:
        grab.remove()
    assert len(calls) == 1 and len(seen) == 1  # once per forward (PVT's mlp.drop fires twice)
    side, width = STAGES[key][1]
    assert calls[0].shape == (2, side, side, m.adapter.stages()[1].blocks[0].mlp.fc2.in_features)
    assert torch.equal(calls[0].flatten(1, 2), seen[0])

    base = m.features(x)

    def zero_units(t: torch.Tensor, hook: object) -> torch.Tensor:
        t = t.clone()
        t[..., :32] = 0
        return t

    assert max_diff(m.run_with_hooks(x, [(site, zero_units)]), base) > 1e-4
    assert torch.equal(m.features(x), base)


@pytest.mark.parametrize("key", ["swin", "pvt"])
def test_insertion_is_refused_clearly(key: str) -> None:
    m, x = hier_model(key)
    with pytest.raises(UnsupportedModelError, match="cannot take extra tokens"):
        m.insert_tokens(1)
    assert m.layout.n_extra == 0 and m.features(x).shape[1] == m.layout.n_tokens


def test_a_dynamic_swin_refuses_a_size_off_the_patch_grid() -> None:
    """The fixed-size Swin and PVT-v2 refusals are in the adapter matrix."""
    dyn, _ = hier_model("swin_dynamic")
    with pytest.raises(InputError, match="multiple of the patch size"):
        dyn.features(images(1, 62))


@pytest.mark.parametrize(("key", "sizes"), [("swin_dynamic", (64, 32)), ("pvt", (96, 64))])
def test_stage_layouts_follow_the_input_size(key: str, sizes: tuple[int, int]) -> None:
    m, _ = hier_model(key)
    for size in sizes:
        _, cache = m.run_with_cache(images(2, size), names="stages.*.hook_out")
        for s in range(4):
            side = -(-size // (4 * 2**s))
            assert cache.layouts[f"stages.{s}.hook_out"].grid == (side, side)
            assert cache[f"stages.{s}.hook_out"].shape[1:3] == (side, side)
        assert m.layout.grid == (side, side)
