"""SC-CLIP: LOF and the 3x3 neighbour repair against loops written from the definitions, the
whole last block against a hand computation on a tiny CLIP, batch equals singles, refusals."""

import functools

import pytest
import torch
import torch.nn.functional as F

import vitreg
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.fix.sc_clip import SCCLIP, lof_outliers, neighbour_mean

SMALL = dict(n_neighbors=4, pre_adjust=1, post_adjust=0, multi=(0, 2))  # a 4-block tower


def hand_lof(x: torch.Tensor, k: int, contamination: float) -> torch.Tensor:
    """The official LOF rule on one image ``[N, C]``, one token at a time."""
    n = len(x)
    d = torch.tensor([[float(((x[i] - x[j]) ** 2).sum()) for j in range(n)] for i in range(n)])
    order = [sorted(range(n), key=lambda j: (d[i, j], j)) for i in range(n)]
    nbrs = [o[1 : k + 1] for o in order]
    kdist = [d[i, nbrs[i][-1]] for i in range(n)]
    lrd = torch.tensor([k / (sum(max(d[i, j], kdist[i]) for j in nbrs[i]) / k) for i in range(n)])
    score = torch.tensor([sum(lrd[j] / lrd[i] for j in nbrs[i]) / k for i in range(n)])
    return score > torch.quantile(score, 1 - contamination)


def test_lof_flags_what_the_official_rule_flags_per_image():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 20, 5, generator=g)
    x[1, 7] += 6.0  # a far token in image 1
    got = lof_outliers(x, n_neighbors=4, contamination=0.1)
    for b in range(3):
        assert torch.equal(got[b], hand_lof(x[b], 4, 0.1))
    assert got[1, 7]


def test_neighbour_mean_replaces_outliers_by_their_valid_3x3_neighbours():
    grid = torch.arange(2 * 3 * 3 * 2, dtype=torch.float).view(2, 3, 3, 2)
    mask = torch.zeros(2, 3, 3, dtype=torch.bool)
    mask[0, 0, 0] = mask[0, 0, 1] = True  # corner + its neighbour, image 0 only
    out = neighbour_mean(grid, mask)
    expected = (grid[0, 1, 0] + grid[0, 1, 1]) / 2  # (0,1) is an outlier too: not averaged
    assert torch.allclose(out[0, 0, 0], expected)
    others = [grid[0, 0, 2], grid[0, 1, 0], grid[0, 1, 1], grid[0, 1, 2]]
    assert torch.allclose(out[0, 0, 1], sum(others) / 4)
    assert torch.equal(out[0, 2], grid[0, 2]) and torch.equal(out[1], grid[1])


@functools.cache
def tower() -> vitreg.Model:
    torch.manual_seed(0)
    m = vitreg.load(
        "timm:vit_base_patch16_clip_quickgelu_224",
        pretrained=False, depth=4, embed_dim=32, num_heads=2, img_size=48,
    )  # fmt: skip
    with torch.no_grad():
        for p in m.module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def attend(blk, x, mid, cls):
    """The official custom_attn from the raw weights, plus 0.3 [CLS]."""
    q, k, v = F.linear(blk.norm1(x), blk.attn.qkv.weight, blk.attn.qkv.bias).chunk(3, -1)
    k, v = (t.unflatten(-1, (2, -1)).transpose(1, 2) for t in (k, v))
    shifted = (mid - mid.mean()) * 3.0
    shifted[shifted < 0] = float("-inf")
    w = (torch.softmax(shifted, -1) + torch.softmax(k @ k.transpose(-2, -1) * 16**-0.5, -1)) / 2
    out = F.linear((w @ v).transpose(1, 2).flatten(2), blk.attn.proj.weight, blk.attn.proj.bias)
    return out + 0.3 * cls


def hand_block(m, feats, x_pen):
    """SC-CLIP's patches for one image from the blocks' outputs ``feats`` [1, N, C]."""
    unit = lambda t: t / t.norm(dim=-1, keepdim=True)  # noqa: E731
    agg = lambda t, c: (c / (c.sum(-1, keepdim=True) + 1e-6)) @ t  # noqa: E731
    grid = (3, 3)
    mask = lof_outliers(x_pen[:, 1:], 4, 0.05).view(1, *grid)
    pre = neighbour_mean(feats[1][:, 1:].reshape(1, *grid, -1), mask).flatten(1, 2)
    mid = unit(pre) @ unit(pre).transpose(-2, -1)
    rep = neighbour_mean(x_pen[:, 1:].reshape(1, *grid, -1), mask).flatten(1, 2)
    x = agg(rep, mid * (mid >= 0.4))
    after = unit(feats[0][:, 1:]) @ unit(feats[0][:, 1:]).transpose(-2, -1)
    after = after * (after >= 0.4)
    blk = m.module.blocks[-1]
    out = agg(attend(blk, x, mid, x_pen[:, :1]), after)
    fused = feats[0] + feats[1]
    return out + agg(attend(blk, fused[:, 1:], mid, fused[:, :1]), after)


def test_last_block_matches_the_hand_computation_and_batch_equals_singles():
    m = tower()
    x = torch.randn(8, 3, 48, 48, generator=torch.Generator().manual_seed(2))
    names = [f"blocks.{i}.hook_resid_post" for i in range(4)]
    _, bare = m.run_with_cache(x, names=names)
    with torch.no_grad(), SCCLIP(**SMALL).applied(m):
        _, cache = m.run_with_cache(x, names=names[-1:])
        singles = torch.cat([m.run_with_cache(x[i : i + 1], names=names[-1:])[1][names[-1]]
                             for i in range(8)])  # fmt: skip
    got = cache[names[-1]]
    assert (got - singles).abs().max() <= 1e-5
    for b in (0, 5):
        feats = [bare[n][b : b + 1] for n in names]
        expected = hand_block(m, feats, feats[2])
        assert torch.allclose(got[b : b + 1, 1:], expected, atol=1e-5, rtol=1e-4)
        assert torch.equal(got[b, 0], bare[names[2]][b, 0])  # [CLS] passes through


def test_published_indices_need_12_blocks_and_lof_needs_enough_patches():
    m = tower()
    with pytest.raises(InputError, match="12-block"):
        SCCLIP().apply(m)
    with SCCLIP(**{**SMALL, "n_neighbors": 9}).applied(m):
        with pytest.raises(InputError, match="more than 9 patches, this input has 9"):
            m(torch.zeros(1, 3, 48, 48))
    siglip = vitreg.load(
        "timm:vit_base_patch16_siglip_224", pretrained=False, depth=4, embed_dim=32,
        num_heads=2, img_size=48,
    )  # fmt: skip
    with pytest.raises(UnsupportedModelError, match="no \\[CLS\\]"):
        SCCLIP(**SMALL).apply(siglip)
