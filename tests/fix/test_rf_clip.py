"""RF-CLIP: the distraction rule and the redistribution matrix against loops written from their
definitions, one edited block against a hand computation from the raw weights, the channel
plant's distraction tokens found exactly and refocused, bad inputs refused by name."""

import functools
import math

import pytest
import torch

import vitreg
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.fix.base import fix_description
from vitreg.fix.methods import FIXES, FixInputs
from vitreg.fix.rf_clip import RFCLIP, distraction_mask, redistribution
from vitreg.hooks.names import hook_name
from vitreg.results.fix import RfClipDescription
from vitreg.testing.tiny import hier_model

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def tower() -> vitreg.Model:
    """A 3-block, 32-wide timm CLIP tower at 48 px (a 3x3 patch grid)."""
    torch.manual_seed(0)
    return vitreg.load(
        "timm:vit_base_patch16_clip_quickgelu_224",
        pretrained=False, depth=3, embed_dim=32, num_heads=2, img_size=48,
    )  # fmt: skip


def test_a_token_is_a_distraction_token_when_a_channel_holds_more_than_tau_of_its_mass():
    x = torch.randn(2, 6, 10, generator=torch.Generator().manual_seed(0))
    x[0, 2, 3] = -40.0  # sign does not matter: the share is of |f|
    x[1, 4, 7] = 40.0
    got = distraction_mask(x, [3, 7], 0.5)
    for b in range(2):
        for i in range(6):
            share = max(abs(float(x[b, i, j])) for j in (3, 7)) / float(x[b, i].abs().sum())
            assert bool(got[b, i]) == (share > 0.5)
    assert got[0, 2] and got[1, 4] and int(got.sum()) == 2


def test_a_distraction_patch_spreads_its_weight_evenly_over_its_clean_neighbours():
    layout = tower().layout  # [CLS] + 3x3 grid
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, 0] = mask[0, 1] = True  # corner and its right-hand neighbour
    mask[1] = True
    mask[1, 8] = False  # image 1: every patch but the last
    m = redistribution(mask, layout)
    assert torch.allclose(m.sum(-1), torch.ones(2, 10))
    p = layout.n_prefix
    for b in range(2):
        for t in range(9):
            r, c = divmod(t, 3)
            clean = [
                j for j in range(9)
                if j != t and abs(j // 3 - r) <= 1 and abs(j % 3 - c) <= 1 and not mask[b, j]
            ]  # fmt: skip
            want = torch.zeros(10)
            if mask[b, t] and clean:
                want[[p + j for j in clean]] = 1 / len(clean)
            else:
                want[p + t] = 1.0
            assert torch.allclose(m[b, p + t], want), (b, t)
    assert torch.equal(m[:, 0], torch.eye(10)[0].expand(2, -1))  # [CLS] keeps itself


def test_an_edited_block_is_the_hand_computed_refocused_block():
    m = tower()
    blk = m.module.blocks[1]
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(1))
    x[0, 3, 5] = 30.0  # one distraction patch in image 0
    fix = RFCLIP(channels=[5], layers=[1], tau=0.3)
    from vitreg.fix.blocks import block_parts

    with torch.no_grad():
        got = fix.block(x, block_parts(m, 1), m.layout)
        mask = distraction_mask(x[:, 1:], [5], 0.3)
        assert mask[0, 2] and int(mask.sum()) == 1
        # patch 2 is grid cell (0, 2): its clean neighbours are cells (0,1), (1,1), (1,2)
        moves = torch.eye(10).repeat(2, 1, 1)
        moves[0, 3] = 0
        moves[0, 3, [2, 5, 6]] = 1 / 3
        y = moves @ x
        h, dh = 2, 16
        qkv = blk.attn.qkv(blk.norm1(y)).view(2, 10, 3, h, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dh), -1) @ moves[:, None]
        assert torch.allclose(att[0, :, :, 3], torch.zeros(2, 10))  # no query attends to it
        out = y + blk.attn.proj((att @ v).transpose(1, 2).flatten(2))
        want = out + blk.mlp(blk.norm2(out))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_without_distraction_tokens_the_model_is_unchanged():
    m = tower()
    x = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = m.features(x)
        with RFCLIP(channels=[0, 1], layers=[0, 1, 2], tau=0.99).applied(m):
            same = m.features(x)
        with RFCLIP(channels=[0, 1], layers=[1, 2], tau=1e-4).applied(m):
            moved = m.features(x)  # every patch flagged: none has a clean neighbour to take it
        with RFCLIP(channels=[0, 1], layers=[1], tau=0.04).applied(m):
            edited = m.features(x)
    torch.testing.assert_close(same, before, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(edited, before, atol=1e-4)
    assert moved.shape == before.shape


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tau": 0.0}, "tau"),
        ({"tau": 1.0}, "tau"),
        ({"tau": -0.2}, "tau"),
        ({"channels": []}, "channels"),
        ({"channels": [3, 3]}, "channels"),
        ({"channels": [-1]}, "channels"),
        ({"layers": [2, 2]}, "layers"),
    ],
)
def test_settings_out_of_range_are_refused(kwargs, match):
    with pytest.raises(InputError, match=match):
        RFCLIP(**kwargs)


def test_models_it_is_not_defined_on_are_refused_by_name():
    m = tower()
    with pytest.raises(InputError, match="768 wide"):
        RFCLIP(layers=[1]).apply(m)  # the published channels belong to ViT-B/16
    with pytest.raises(InputError, match="12-block"):
        RFCLIP(channels=[1]).apply(m)
    with pytest.raises(InputError, match="< the width 32"):
        RFCLIP(channels=[40], layers=[1]).apply(m)
    with pytest.raises(InputError, match="< the depth 3"):
        RFCLIP(channels=[1], layers=[3]).apply(m)
    swin, _ = hier_model("swin")
    with pytest.raises(UnsupportedModelError, match="windows or stages"):
        RFCLIP(channels=[1], layers=[0]).apply(swin)
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(m.features(x), m.module.forward_features(x))


def test_the_channel_plant_refuses_channels_that_are_not_distinct_indices():
    from vitreg.testing.planted.planted_channels import build_channel_plant

    for bad in ((), (3, 3), (-1, 2)):
        with pytest.raises(InputError, match="distinct"):
            build_channel_plant(channels=bad)


def test_registered_with_its_published_settings():
    fix = FIXES.build("rf-clip", FixInputs(tower()))
    assert isinstance(fix, RFCLIP) and FIXES["rf-clip"].last_block
    said = fix_description(fix)
    assert isinstance(said, RfClipDescription)
    assert said.channels == [4, 162, 474] and said.layers == list(range(6, 12))
    assert said.tau is None and fix.threshold(768) == 5 / 768


@pytest.mark.slow  # about 15 s on a shared CPU: builds the planted ViT-B/16
def test_the_planted_distraction_tokens_are_found_exactly_and_refocused():
    from vitreg.testing.images import synthetic_images
    from vitreg.testing.planted.planted_channels import build_channel_plant

    module, truth = build_channel_plant(img_size=112)
    m = vitreg.wrap(module)
    images = truth.base.normalize(synthetic_images(6, 112, seed=3))
    want = truth.distraction_mask(images).flatten(1)
    assert 0 < want.float().mean() < 0.5
    seen: dict[int, torch.Tensor] = {}

    def grab(i: int):
        def hook(t: torch.Tensor, ctx) -> None:
            seen[i] = distraction_mask(ctx.layout.take(t, "patches"), truth.channels, 5 / 768)

        return hook

    sites = [(hook_name(i, "hook_resid_pre"), grab(i)) for i in range(12)]
    with torch.no_grad():
        handle = m.hooks(sites)
        m.features(images)
        found = dict(seen)
        with RFCLIP().applied(m):
            m.features(images)  # the inner sites of edited blocks stay silent, resid_pre fires
        handle.remove()
    for i in range(12):
        if i < truth.first_layer:
            assert not found[i].any(), i
        else:
            assert torch.equal(found[i], want), i
    # a distraction patch with a clean 3x3 neighbour is refocused in the block it enters; one
    # inside a distraction region keeps its weight until the region's edge has been peeled to it
    layout = m.layout_for((112, 112))
    inside = redistribution(want, layout)[:, layout.patches, layout.patches].diagonal(0, 1, 2)
    assert torch.equal(seen[truth.first_layer + 1], want & (inside == 1))
    counts = [int(seen[i].sum()) for i in range(truth.first_layer, 12)]
    assert counts[0] == int(want.sum())
    assert all(a > b or b == 0 for a, b in zip(counts, counts[1:], strict=False))
