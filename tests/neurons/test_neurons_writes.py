"""What units write: a unit's write is measured as the model runs it (LayerScale included);
a kept unit writing across its block's outliers is off-direction; a unit joins a chosen one as
its sibling only with its write, on the outlier patches, in its block."""

from __future__ import annotations

import torch

from vitreg.models.wrapping import wrap
from vitreg.neurons.writes import (
    ALIGNED,
    SIBLING_ACT,
    SIBLING_COS,
    off_direction,
    outlier_directions,
    sibling_matches,
    unit_writes,
)
from vitreg.testing.tiny import timm_vit


def test_a_units_write_is_its_output_column_through_layer_scale() -> None:
    """On a DINOv2-layout ViT with LayerScale far from 1, the measured write of each unit is
    gamma * fc2[:, unit] (the raw column points elsewhere once gamma varies per channel)."""
    module, size = timm_vit("dinov2")
    model = wrap(module)
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    units = [(0, 3), (0, 40), (1, 7), (1, 8), (1, 100)]
    got = unit_writes(model, units, images)
    for layer, u in units:
        blk = module.blocks[layer]
        want = blk.ls2.gamma.detach() * blk.mlp.fc2.weight.detach()[:, u]
        assert torch.allclose(got[(layer, u)], want, atol=1e-5), (layer, u)
    raw = module.blocks[1].mlp.fc2.weight.detach()[:, 7]
    assert torch.cosine_similarity(got[(1, 7)], raw, dim=0) < 0.99


def test_more_units_than_the_images_hold_slots_for_are_measured_over_several_passes() -> None:
    """One image holds one token slot per token, one kept at 0: a block's units beyond that are
    measured in further passes, each the same as measured alone."""
    module, size = timm_vit("dinov2")
    model = wrap(module)
    image = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(4))
    units = [(0, u) for u in range(model.layout.n_tokens + 5)]
    got = unit_writes(model, units, image)
    gamma, fc2 = module.blocks[0].ls2.gamma.detach(), module.blocks[0].mlp.fc2.weight.detach()
    for _, u in units:
        assert torch.allclose(got[(0, u)], gamma * fc2[:, u], atol=1e-5), u


def test_a_sibling_shares_a_chosen_units_write_and_fires_on_its_patches() -> None:
    """Joins: same block, write cosine >= SIBLING_COS, activation >= SIBLING_ACT of the chosen
    unit's; each condition alone is refused."""
    g = torch.Generator().manual_seed(1)
    v = torch.randn(64, generator=g)
    near = v + 0.2 * v.norm() / 8 * torch.randn(64, generator=g)
    far = torch.randn(64, generator=g)
    writes = {(3, 0): v, (3, 1): near, (3, 2): far, (3, 3): near.clone(), (4, 0): near.clone()}
    acts = {3: torch.tensor([10.0, 9.0, 9.0, 0.5 * SIBLING_ACT * 10]), 4: torch.tensor([9.0])}
    assert torch.cosine_similarity(near, v, dim=0) >= SIBLING_COS
    assert torch.cosine_similarity(far, v, dim=0) < SIBLING_COS
    found = sibling_matches([(3, 0)], [(3, 1), (3, 2), (3, 3), (4, 0)], writes, acts)
    assert list(found) == [(3, 1)]
    assert found[(3, 1)][0] == (3, 0)


def test_a_unit_writing_across_its_blocks_outliers_is_off_direction() -> None:
    """Against the outlier direction of its block, a write at under ALIGNED of the block's
    best-aligned kept unit's cosine is off; a block's only unit is its own best; a block
    judges its own units only."""
    g = torch.Generator().manual_seed(2)
    d3, d4 = torch.randn(32, generator=g), torch.randn(32, generator=g)
    across = torch.randn(32, generator=g)
    across = across - (across @ d3) / (d3 @ d3) * d3 + 0.1 * d3  # cosine ~0.1 with d3
    writes = {(3, 0): d3 + 0.3 * torch.randn(32, generator=g), (3, 1): across, (4, 0): across}
    off = off_direction([(3, 0), (3, 1), (4, 0)], writes, {3: d3, 4: d4})
    assert list(off) == [(3, 1)]
    cos, best = off[(3, 1)]
    assert cos < ALIGNED * best


def test_the_outlier_direction_is_the_outlier_patches_mean_less_the_ordinary_ones() -> None:
    """Against a direct computation from the residual at the block's output (two batches, the
    prefix tokens never counted)."""
    module, size = timm_vit("dinov2")
    model = wrap(module)
    images = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(3))
    n = model.layout.n_tokens
    masks = [torch.zeros(2, n, dtype=torch.bool), torch.zeros(1, n, dtype=torch.bool)]
    patches = torch.arange(n)[model.layout.patches]
    masks[0][0, patches[:3]] = True
    masks[0][1, patches[5]] = True
    masks[1][0, patches[-2:]] = True
    masks[1][0, 0] = True  # a prefix token flagged: not a patch, not counted
    got = outlier_directions(model, images, masks, [1], batch_size=2)
    _, cache = model.run_with_cache(images, names="blocks.1.hook_resid_post")
    resid = cache["blocks.1.hook_resid_post"].double()
    flagged = torch.cat(masks)
    in_patches = torch.zeros_like(flagged)
    in_patches[:, patches] = True
    want = resid[flagged & in_patches].mean(0) - resid[~flagged & in_patches].mean(0)
    assert torch.allclose(got[1].double(), want, atol=1e-4)
