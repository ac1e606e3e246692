"""Where outliers sit: neighbour redundancy (exact on hand-made grids), placement on planted models."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

import vitreg
from vitreg.analysis.base import run_analyses
from vitreg.analysis.norms import NormAnalysis
from vitreg.analysis.redundancy import (
    NeighbourSimilarity,
    RedundancyAnalysis,
    neighbour_similarity,
    placement,
)
from vitreg.core.layout import TokenLayout
from vitreg.errors import HookError, VitregError
from vitreg.hooks.sites import HookContext
from vitreg.results.diagnose import Redundancy
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build, build_unplanted

SIZE = 112


@pytest.fixture(scope="module")
def images():
    return synthetic_images(16, size=SIZE, seed=1, flat_fraction=0.1)


@pytest.fixture(scope="module")
def planted(images):
    model = vitreg.wrap(build("dinov2_s14", img_size=SIZE)[0])
    analyses = [NormAnalysis(), RedundancyAnalysis(max_maps=4)]
    results, _, _ = run_analyses(model, images, analyses, batch_size=8)
    return model, results


def by_loops(grid: torch.Tensor) -> dict[str, torch.Tensor]:
    """Reference: average the cosine to every in-grid neighbour, one patch at a time."""
    b, h, w, _ = grid.shape
    out = {k: torch.full((b, h, w), math.nan) for k in ("n4", "n8")}
    for y in range(h):
        for x in range(w):
            for k, diag in (("n4", False), ("n8", True)):
                cos = [
                    F.cosine_similarity(grid[:, y, x], grid[:, y + dy, x + dx], dim=-1)
                    for dy in (-1, 0, 1)
                    for dx in (-1, 0, 1)
                    if (dy or dx) and (diag or not (dy and dx))
                    if 0 <= y + dy < h and 0 <= x + dx < w
                ]
                if cos:
                    out[k][:, y, x] = torch.stack(cos).mean(0)
    return out


def test_checkerboard_neighbours_exact_including_borders():
    colour = (torch.arange(3)[:, None] + torch.arange(3)[None]) % 2
    grid = F.one_hot(colour, 2).float()[None] * 3.0  # 4-neighbours orthogonal, diagonals equal
    sims = neighbour_similarity(grid)
    assert torch.equal(sims["n4"], torch.zeros(1, 3, 3))
    # corner: 2 + 1 diagonal; edge: 3 + 2 diagonals; centre: 4 + 4 diagonals
    want = torch.tensor([[1 / 3, 2 / 5, 1 / 3], [2 / 5, 1 / 2, 2 / 5], [1 / 3, 2 / 5, 1 / 3]])
    torch.testing.assert_close(sims["n8"][0], want)


@pytest.mark.parametrize("shape", [(2, 4, 5), (1, 1, 6), (1, 3, 1), (1, 2, 2)])
def test_neighbour_similarity_matches_loops(shape):
    grid = torch.randn(*shape, 7, generator=torch.Generator().manual_seed(3))
    sims, ref = neighbour_similarity(grid), by_loops(grid)
    for k in ("n4", "n8"):
        torch.testing.assert_close(sims[k], ref[k])


def test_single_patch_has_no_neighbours():
    sims = neighbour_similarity(torch.randn(2, 1, 1, 4))
    assert sims["n4"].isnan().all() and sims["n8"].isnan().all()


def test_reducer_reads_token_sequences_and_merges():
    layout = TokenLayout(1, 2, (3, 4), (14, 14))
    tokens = torch.randn(5, layout.n_tokens, 6)
    ctx = HookContext("blocks.0.hook_resid_post", 0, layout)
    whole, a, b = (NeighbourSimilarity("s") for _ in range(3))
    whole(tokens, ctx, 0)
    a(tokens[:2], ctx, 0)
    b(tokens[2:], ctx, 2)
    a.merge(b)
    want = neighbour_similarity(layout.patch_grid(tokens))
    for r in (whole, a):
        got = r.result()
        assert got["grid"] == (3, 4)
        for k in ("n4", "n8"):
            torch.testing.assert_close(got[k], want[k])


def test_placement_by_hand():
    embed = torch.zeros(1, 4, 4)
    embed[0, :2, :2] = torch.tensor([[0.9, 0.8], [0.95, 1.0]])  # top quarter = background
    mask = torch.zeros(1, 4, 4, dtype=torch.bool)
    mask[0, 0, 0] = mask[0, 1, 1] = mask[0, 3, 3] = True  # 2 border + 1 interior, 2 in background
    vs, curve, border, bg = placement(embed, {"embed_n4": embed}, mask)
    assert border.n_border == 12 and border.n_interior == 4
    assert border.outlier_rate_border == pytest.approx(2 / 12)
    assert border.outlier_rate_interior == pytest.approx(1 / 4)
    assert bg.fraction == pytest.approx(4 / 16) and bg.threshold == pytest.approx(
        0.2
    )  # p75 interpolates 0 and 0.8
    assert bg.outlier_rate_background == pytest.approx(2 / 4)
    assert bg.outlier_rate_foreground == pytest.approx(1 / 12)
    assert bg.outlier_share_in_background == pytest.approx(2 / 3)
    assert vs["embed_n4"].outlier.n == 3 and vs["embed_n4"].normal.n == 13
    assert vs["embed_n4"].outlier.median == pytest.approx(0.9)
    # 12 tied zeros collapse the lower deciles into one bin
    assert sum(b.n for b in curve.bins) == 16 and curve.bins[0].n == 12
    assert curve.bins[0].outlier_rate == pytest.approx(1 / 12)


def test_planted_outliers_sit_on_redundant_patches(planted, images):
    _, results = planted
    r, norms = results["redundancy"], results["norms"]
    assert (
        r.summary.outlier_method == "auto"
        and r.summary.layer_site == "blocks.11.hook_resid_post"
        and r.summary.layer == 11
    )
    assert torch.equal(r.outliers, norms.masks(r.summary.layer_site, "auto"))
    assert 0.03 < r.outliers.float().mean() < 0.2
    assert r.embed_maps.shape == (4, 8, 8) and r.layer_maps.shape == (4, 8, 8)
    assert r.embed["n4"].shape == (16, 8, 8)
    # flat patches share their neighbours' colour and bias, with no texture term of their own
    emb = r.summary.outlier_vs_normal["embed_n4"]
    assert emb.outlier.median > emb.normal.median + 0.03
    assert emb.outlier.mean > emb.normal.mean and emb.auc > 0.65
    assert r.summary.outlier_vs_normal["embed_n8"].auc > 0.65
    rates = [b.outlier_rate for b in r.summary.rate_by_redundancy.bins]
    half = len(rates) // 2
    assert len(rates) == 10 and rates[-1] > 5 * rates[0]
    assert sum(rates[half:]) > 3 * sum(rates[:half])
    bg = r.summary.background
    assert bg.outlier_rate_background > 2 * bg.outlier_rate_foreground
    assert bg.outlier_share_in_background > 1.5 * bg.fraction
    # at the last layer an outlier's big vector points away from its neighbours
    lay = r.summary.outlier_vs_normal["layer_n4"]
    assert lay.outlier.median < lay.normal.median - 0.3
    d = r.summary
    assert isinstance(d, Redundancy)
    json.dumps(d.model_dump(), allow_nan=False)
    assert d.outlier_method == "auto" and d.n_outliers == int(r.outliers.sum()) and d.note is None


def test_unplanted_has_no_auto_outliers_and_says_so(images):
    model = vitreg.wrap(build_unplanted("dinov2_s14", img_size=SIZE))
    x = images[:8]
    results, _, _ = run_analyses(model, x, [NormAnalysis(), RedundancyAnalysis(method="auto")])
    r = results["redundancy"]
    assert not results["norms"].summary.artifacts_present
    assert r.summary.n_outliers == 0 and "no outliers" in r.summary.note
    d = r.summary
    json.dumps(d.model_dump(), allow_nan=False)
    assert d.outlier_rate == 0.0 and d.outlier_vs_normal["embed_n4"].outlier is None
    assert d.border.outlier_rate_border == 0.0 and d.background.outlier_rate_background == 0.0
    assert all(b.outlier_rate in (0.0, None) for b in d.rate_by_redundancy.bins)
    # by default a negative verdict falls back to top-p and says why
    results, _, _ = run_analyses(model, x, [NormAnalysis(), RedundancyAnalysis()])
    r = results["redundancy"]
    assert (
        r.summary.outlier_method == "top_p"
        and "verdict negative" in r.summary.outlier_method_reason
        and r.summary.n_outliers > 0
    )


def test_hierarchical_pvt_pools_embed_onto_stage_grid():
    torch.manual_seed(0)
    model = vitreg.load("timm:pvt_v2_b0", pretrained=False)
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    stage1 = "stages.1.blocks.1.hook_resid_post"
    for layer, grid in ((None, (2, 2)), (stage1, (8, 8))):
        results, skipped, _ = run_analyses(
            model, x, [NormAnalysis(), RedundancyAnalysis(layer=layer)]
        )
        r = results["redundancy"]
        assert not skipped and r.at_layer["n4"].shape == (4, *grid)
        assert r.embed["n4"].shape == (4, 16, 16) and "average-pooled" in r.summary.note
        assert (
            r.summary.outlier_vs_normal["embed_n4"].normal.n + r.summary.n_outliers
            == 4 * grid[0] * grid[1]
        )
        json.dumps(r.summary.model_dump(), allow_nan=False)
    assert r.summary.layer_site == stage1


def test_layer_choice_and_order_errors():
    model = vitreg.wrap(build_unplanted("deit3_s16", img_size=32))
    assert RedundancyAnalysis(layer=-2).site(model) == ("blocks.10.hook_resid_post", 10)
    assert RedundancyAnalysis(layer=3).site(model)[0] == "blocks.3.hook_resid_post"
    for bad in (12, "blocks.0.attn.hook_q"):
        with pytest.raises(HookError):
            RedundancyAnalysis(layer=bad).reducers(model)
    with pytest.raises(ValueError, match="unknown outlier method"):
        RedundancyAnalysis(method="median")
    x = synthetic_images(2, size=32, seed=0)
    with pytest.raises(VitregError, match="after NormAnalysis"):
        run_analyses(model, x, [RedundancyAnalysis(), NormAnalysis()])
