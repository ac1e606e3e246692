"""Planted-artifact fixtures: the ground truth every detection / discovery / fix test relies on."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

import vitreg
from vitreg.errors import InputError, SpecError
from vitreg.models.loaders.local import save_local
from vitreg.testing import build, list_planted, make_synthetic
from vitreg.testing.planted import FlatRule, GroundTruth

# 6x6 patch grids: small enough to be fast, large enough for whole flat patches
SIZES = {"dinov2_s14": 84, "dinov2_s14_reg4": 84, "dinov2_s14_swiglu": 84}
SIZES.update(clip_b16=96, deit3_s16=96)
FAST = ["dinov2_s14", "dinov2_s14_reg4", "dinov2_s14_swiglu", "deit3_s16"]
ALL = [*FAST, pytest.param("clip_b16", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def fixtures() -> Callable[[str], tuple]:
    """Build each fixture once per module (building is the slow part)."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            module, truth = build(name, img_size=SIZES[name], seed=0)
            images = make_synthetic(8, SIZES[name], seed=7, flat_fraction=0.4)
            x = truth.normalize(images.images)
            cache[name] = (module, truth, x)
        return cache[name]

    return get


def patch_ratios(model: vitreg.Model, x: torch.Tensor) -> dict[int, torch.Tensor]:
    """Residual norm / the image's median patch norm, ``[B, h, w]`` after every block."""
    _, cache = model.run_with_cache(x, names="blocks.*.hook_resid_post", reduce="norm")
    out = {}
    for layer in range(model.n_layers):
        norms = cache.patches(f"blocks.{layer}.hook_resid_post")
        out[layer] = norms / norms.flatten(1).median(dim=1).values[:, None, None]
    return out


def masks(truth, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(selected, not selected) patches, leaving out the thin band around the threshold."""
    clear = ~truth.ambiguous_mask(x)
    sel = truth.outlier_mask(x)
    return sel & clear, ~sel & clear


def test_list_planted_names_and_descriptions() -> None:
    from vitreg.testing.planted import KINDS

    names = list_planted()
    assert set(names) == {
        "dinov2_s14",
        "dinov2_s14_reg4",
        "dinov2_s14_swiglu",
        "clip_b16",
        "clip_t16",
        "hf_clip_t16",
        "deit3_s16",
        "dinov2_s14_early",
        "dinov2_s14_multiblock",
        *KINDS,  # one tiny model per kind of artifact (issue 20)
        "pruning",  # a known token-pruning curve
    }
    assert all(isinstance(d, str) and d for d in names.values())


@pytest.mark.parametrize("name", ALL)
def test_selected_patches_are_outliers_from_first_layer(fixtures, name: str) -> None:
    module, truth, x = fixtures(name)
    sel, rest = masks(truth, x)
    assert sel.sum() >= 10 and rest.sum() >= 60  # the images exercise both sides
    ratios = patch_ratios(vitreg.wrap(module), x)
    first = truth.first_outlier_layer
    for layer, r in ratios.items():
        assert r[rest].quantile(0.99) < 3.0, f"spurious outliers at layer {layer}"
        if layer < first:
            assert r.max() < 3.0, f"outliers before the first planted layer ({layer})"
        else:
            assert r[sel].min() >= 10.0, f"layer {layer}: min ratio {r[sel].min():.1f}"
    assert (
        0.5 * truth.expected_norm_ratio
        < ratios[first][sel].median()
        < 2 * truth.expected_norm_ratio
    )


@pytest.mark.parametrize("name", ALL)
def test_planted_units_fire_exactly_on_selected(fixtures, name: str) -> None:
    module, truth, x = fixtures(name)
    sel, rest = masks(truth, x)
    model = vitreg.wrap(module)
    names = [f"blocks.{layer}.mlp.hook_post" for layer in truth.layers]
    _, cache = model.run_with_cache(x, names=names)
    for layer, units in truth.units_by_layer().items():
        acts = cache.patches(f"blocks.{layer}.mlp.hook_post")
        planted = acts[..., units]
        assert planted[sel].min() > 10.0
        assert planted[rest].abs().max() < 0.1
        others = torch.ones(acts.shape[-1], dtype=torch.bool)
        others[units] = False
        # the planted units are the top units of their layer by mean activation on outliers
        mean_sel = acts[sel].mean(0)
        assert mean_sel[units].min() > 3 * mean_sel[others].abs().max()


@pytest.mark.parametrize("name", ALL)
def test_zeroing_planted_units_removes_outliers(fixtures, name: str) -> None:
    module, truth, x = fixtures(name)
    model = vitreg.wrap(module)

    def zero(units: list[int]):
        def fn(t: torch.Tensor, hook) -> torch.Tensor:
            t = t.clone()
            t[..., units] = 0
            return t

        return fn

    by_layer = truth.units_by_layer()
    hooks = [(f"blocks.{layer}.mlp.hook_post", zero(u)) for layer, u in by_layer.items()]
    with model.hooks(hooks):
        ratios = patch_ratios(model, x)
    assert max(r.max().item() for r in ratios.values()) < 3.0


def test_prefix_tokens_are_not_outliers(fixtures) -> None:
    module, truth, x = fixtures("dinov2_s14_reg4")
    model = vitreg.wrap(module)
    layer = truth.first_outlier_layer + 1
    _, cache = model.run_with_cache(x, names=f"blocks.{layer}.hook_resid_post", reduce="norm")
    norms = cache[f"blocks.{layer}.hook_resid_post"]
    layout = cache.layout(f"blocks.{layer}.hook_resid_post")
    median = layout.take(norms, "patches").median(dim=1).values
    assert (layout.take(norms, "prefix") / median[:, None]).max() < 3.0


def test_outliers_become_attention_sinks(fixtures) -> None:
    module, truth, x = fixtures("dinov2_s14")
    model = vitreg.wrap(module)
    layer = truth.sink_layers[0]
    name = f"blocks.{layer}.attn.hook_pattern"
    _, cache = model.run_with_cache(x, names=name)
    layout = cache.layout(name)
    cls_to_patches = cache[name][:, :, layout.cls, layout.patches].mean(dim=(1, 2))
    sel = truth.outlier_mask(x).flatten(1).float()
    share = (cls_to_patches * sel).sum(1) / cls_to_patches.sum(1)
    assert (share > 2 * sel.mean(1)).all()  # [CLS] attends to outliers far above their share
    assert share.mean() > 0.4


def test_build_is_deterministic() -> None:
    a, ta = build("deit3_s16", img_size=32, seed=3)
    b, tb = build("deit3_s16", img_size=32, seed=3)
    c, tc = build("deit3_s16", img_size=32, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not any(torch.equal(sa[k], sc[k]) for k in ("pos_embed", "blocks.0.mlp.fc1.weight"))
    assert ta == tb and ta.units != tc.units
    # which units are planted depends on the seed, not on the image size
    assert build("deit3_s16", img_size=48, seed=3)[1].units == ta.units


def test_ground_truth_is_json(fixtures) -> None:
    _, truth, x = fixtures("dinov2_s14")
    assert isinstance(truth, GroundTruth) and isinstance(truth.rule, FlatRule)
    d = json.loads(json.dumps(truth.model_dump(mode="json")))
    assert list(d)[:4] == ["name", "architecture", "model_args", "seed"]
    assert list(d["rule"]) == [
        "patch_size", "threshold", "n_filters", "filter_seed", "approx_std", "text"
    ]  # fmt: skip
    assert d["rule"]["approx_std"] == truth.rule.approx_std
    assert d["writer_layers"] == list(truth.writer_layers) and truth.writer_layers
    assert d["units"] == [list(u) for u in truth.units]
    assert d["first_outlier_layer"] == truth.first_outlier_layer
    assert d["rule"]["threshold"] == truth.rule.threshold and "flat" in d["rule"]["text"]
    assert d["architecture"] == "vit_small_patch14_dinov2"
    mask = truth.outlier_mask(x)
    assert mask.shape == (x.shape[0], 6, 6) and mask.dtype == torch.bool
    with pytest.raises(InputError, match="multiple"):
        truth.outlier_mask(x[..., :80, :80])


def test_save_local_round_trip(fixtures, tmp_path) -> None:
    module, truth, x = fixtures("dinov2_s14_swiglu")  # SwiGLU must survive JSON model_args
    save_local(module, tmp_path, **truth.model_args)
    loaded = vitreg.load(f"local:{tmp_path}")
    with torch.no_grad():
        assert torch.equal(loaded.features(x), vitreg.wrap(module).features(x))


def test_load_planted_spec() -> None:
    with pytest.warns(UserWarning, match="synthetic"):
        model = vitreg.load("planted:dinov2_s14", img_size=56, seed=1)
    truth = model.module.vitreg_planted
    assert truth.name == "dinov2_s14" and truth.seed == 1
    assert model.layout.grid == (4, 4)
    assert any("synthetic" in n for n in model.notes)


def test_unknown_planted_name_lists_names() -> None:
    with pytest.raises(SpecError, match="dinov2_s14"):
        build("dinov3_h16")
    with pytest.raises(SpecError, match="clip_b16"):
        vitreg.load("planted:nope")
    with pytest.raises(SpecError, match="img_size and seed"):
        vitreg.load("planted:dinov2_s14", depth=2)


def test_a_rule_given_by_position_still_builds_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="by keyword"):
        rule = FlatRule(14, 0.05, 16, filter_seed=0)
    assert rule == FlatRule(patch_size=14, threshold=0.05, n_filters=16, filter_seed=0)
    with pytest.raises(TypeError, match="at most 4"):
        FlatRule(14, 0.05, 16, 0, 5)
