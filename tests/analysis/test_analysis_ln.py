"""LN separation: exact pair similarities on hand-made tokens; model numbers equal a direct computation."""

import math

import pytest
import torch
import torch.nn.functional as F

import vitreg
from vitreg import UnsupportedModelError
from vitreg.analysis.ln_separation import OWNED, ln_separation, pair_similarities
from vitreg.core.layout import TokenLayout
from vitreg.results.diagnose import LNSeparation
from vitreg.testing.tiny import timm_vit


def direct(x, n_cls, regs, patches):
    """Mean cosines by explicit loops over token pairs."""
    u = F.normalize(x, dim=-1)
    p = u[patches]
    n = p.shape[0]
    pp = sum(float(p[i] @ p[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    out = {"patch_patch": pp}
    if n_cls:
        out["cls_patch"] = float((p @ u[0]).mean())
    r = u[regs]
    if r.shape[0]:
        out["register_patch"] = float((r @ p.T).mean())
        out["register_cls"] = float((r @ u[0]).mean())
    return out


def test_pair_similarities_match_explicit_pairs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 1 + 2 + 6, 5, generator=g)
    got = pair_similarities(x, TokenLayout(1, 2, (2, 3), (1, 1)))
    for b in range(2):
        want = direct(x[b], 1, slice(1, 3), slice(3, 9))
        for k, v in want.items():
            assert got[k][b].item() == pytest.approx(v, abs=1e-6)


def test_hand_made_case_orthogonal_after_centering():
    # cls lives on channel 0, patches share channel 1 plus a common offset on every channel
    cls = torch.tensor([10.0, 0, 0, 0]) + 3
    patches = torch.tensor([[0, 5.0, 1, -1], [0, 5.0, -1, 1]]) + 3
    x = torch.cat([cls[None], patches])[None]
    layout = TokenLayout(1, 0, (1, 2), (1, 1))
    sims = pair_similarities(x, layout)
    assert sims["cls_patch"].item() > 0.5  # the shared offset makes raw tokens look alike
    centred = x - x.mean(-1, keepdim=True)
    assert pair_similarities(centred, layout)["cls_patch"].item() < 0


def test_model_numbers_equal_a_direct_computation():
    module, size = timm_vit("dinov2_reg4")
    model = vitreg.wrap(module)
    x = torch.randn(5, 3, size, size, generator=torch.Generator().manual_seed(2))
    res = ln_separation(model, x, batch_size=2)
    _, cache = model.run_with_cache(x, names=["blocks.1.ln1.hook_in", "blocks.1.ln1.hook_out"])
    lay = model.layout
    for point, site in (("pre_ln1", "blocks.1.ln1.hook_in"), ("post_ln1", "blocks.1.ln1.hook_out")):
        per_image = [direct(cache[site][b], 1, lay.registers, lay.patches) for b in range(5)]
        for pair in ("cls_patch", "patch_patch", "register_patch", "register_cls"):
            vals = torch.tensor([d[pair] for d in per_image])
            got = res.summary.similarity[1][point][pair]
            assert got.mean == pytest.approx(vals.mean().item(), abs=1e-5)
            assert got.std == pytest.approx(vals.std(unbiased=False).item(), abs=1e-4)
            assert got.n == 5
    a = cache["blocks.1.ln1.hook_in"].abs()
    r = torch.log(a[:, 0].mean(0) / a[:, lay.patches].mean((0, 1)))
    assert torch.allclose(res.ownership[1], r, atol=1e-4)
    assert res.summary.owned_channel_fraction[1] == pytest.approx(
        float((r.abs() > OWNED).float().mean())
    )
    gamma = module.blocks[1].norm1.weight.abs()
    owned = r.abs() > OWNED
    if owned.any() and (~owned).any():
        want = (gamma[owned].mean() / gamma[~owned].mean()).item()
        assert res.summary.ln1_gain_owned_over_other[1] == pytest.approx(want, rel=1e-5)
    assert isinstance(res.summary, LNSeparation)
    assert res.summary.has_cls and res.summary.has_registers
    assert math.isfinite(res.summary.similarity[0]["post_ln2"]["patch_patch"].mean)


def test_no_cls_model_is_not_applicable():
    module, size = timm_vit("siglip")
    with pytest.raises(UnsupportedModelError, match="no \\[CLS\\]"):
        ln_separation(vitreg.wrap(module), torch.randn(1, 3, size, size))
