"""Role-annotated planted fixtures: causes vs downstream readers vs distractors.

A register-neuron selection must pick the units that create the outliers. These tests check the
ground truth that such a selection is scored against: the outliers appear exactly where and when
the truth says, zeroing the causal units removes them, zeroing readers or distractors does not,
and the readers (not the causes) top the mean-|activation|-on-outliers ranking.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

import vitreg
from vitreg.analysis.thresholds import bimodal_fit
from vitreg.testing import list_planted, make_synthetic
from vitreg.testing.planted import build, build_unplanted

SIZE = 112  # 8x8 patch grid
NEW = ["dinov2_s14_early", "dinov2_s14_multiblock"]
CUT = 5.0  # a patch whose norm is > CUT x its image's median patch norm counts as an outlier


@pytest.fixture(scope="module")
def fixtures():
    """Each new fixture built once, with its wrapped model and preprocessed images."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            module, truth = build(name, img_size=SIZE, seed=0)
            images = make_synthetic(12, SIZE, seed=7, flat_fraction=0.3)
            cache[name] = (vitreg.wrap(module), truth, truth.normalize(images.images))
        return cache[name]

    return get


def _zero(units: list[int]):
    def fn(t: torch.Tensor, hook) -> torch.Tensor:
        t = t.clone()
        t[..., units] = 0
        return t

    return fn


def patch_norms(model: vitreg.Model, x: torch.Tensor, zero=()) -> dict[int, torch.Tensor]:
    """Patch norms ``[B, h, w]`` after every block, with the ``(layer, unit)`` pairs zeroed."""
    by_layer: dict[int, list[int]] = {}
    for layer, unit, *_ in zero:
        by_layer.setdefault(layer, []).append(unit)
    hooks = [(f"blocks.{layer}.mlp.hook_post", _zero(u)) for layer, u in by_layer.items()]
    with model.hooks(hooks):
        _, cache = model.run_with_cache(x, names="blocks.*.hook_resid_post", reduce="norm")
    return {i: cache.patches(f"blocks.{i}.hook_resid_post") for i in range(model.n_layers)}


def ratios(norms: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Norm over the image's median patch norm."""
    return {i: n / n.flatten(1).median(dim=1).values[:, None, None] for i, n in norms.items()}


def present(norms: dict[int, torch.Tensor]) -> dict[int, bool]:
    """vitreg's presence test on the pooled patch norms of each block."""
    return {i: bimodal_fit(n.numpy()).present for i, n in norms.items()}


def masks(truth, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(selected, not selected) patches away from the ambiguous band around the threshold."""
    clear = ~truth.ambiguous_mask(x)
    sel = truth.outlier_mask(x)
    return sel & clear, ~sel & clear


def test_listed_with_roles_and_json() -> None:
    names = list_planted()
    assert set(NEW) <= set(names) and all(names[n] for n in NEW)
    _, truth = build("dinov2_s14", img_size=28)  # the old fixtures get roles too
    assert truth.causal_units == tuple((6, u) for u in truth.units_by_layer()[6])
    assert truth.reader_units == tuple((7, u) for u in truth.units_by_layer()[7])
    assert truth.distractor_units == () and truth.emergence_layer == truth.first_outlier_layer
    d = json.loads(json.dumps(truth.model_dump(mode="json")))
    assert d["causal_units"] == [list(u) for u in truth.causal_units]


@pytest.mark.parametrize("name", NEW)
def test_ground_truth_roles(fixtures, name: str) -> None:
    _, truth, _ = fixtures(name)
    assert truth.units == truth.causal_units + truth.reader_units
    assert truth.first_outlier_layer == truth.emergence_layer
    assert truth.emergence_layer == max(layer for layer, _ in truth.causal_units)
    assert min(layer for layer, _ in truth.reader_units) > truth.emergence_layer
    assert truth.sink_layers[0] == truth.emergence_layer + 1
    causal = {layer for layer, _ in truth.causal_units}
    if name == "dinov2_s14_early":
        assert causal == {2} and len(truth.causal_units) == 3 and truth.distractor_units == ()
    else:
        assert causal == {2, 3, 4} and len(truth.causal_units) == 6
        assert [layer for layer, _ in truth.reader_units] == [6, 7, 8, 9]
        kinds = [k for *_, k in truth.distractor_units]
        assert sorted(kinds) == ["cls", "cls", "texture", "texture"]
        assert all(2 <= layer <= 4 for layer, *_ in truth.distractor_units)
    d = json.loads(json.dumps(truth.model_dump(mode="json")))
    assert d["emergence_layer"] == truth.emergence_layer
    assert d["distractor_units"] == [list(u) for u in truth.distractor_units]
    assert truth.units_by_layer("reader") == {layer: [u] for layer, u in truth.reader_units}


@pytest.mark.parametrize("name", NEW)
def test_outliers_match_the_rule_from_the_emergence_layer(fixtures, name: str) -> None:
    model, truth, x = fixtures(name)
    sel, rest = masks(truth, x)
    assert sel.sum() >= 40 and rest.sum() >= 300  # the images exercise both sides
    norms = patch_norms(model, x)
    r, fits = ratios(norms), present(norms)
    first = truth.emergence_layer
    flagged = r[first] > CUT
    tp = (flagged & sel).sum().item()
    assert tp / (flagged & (sel | rest)).sum().item() >= 0.95  # precision
    assert tp / sel.sum().item() >= 0.95  # recall
    for layer in range(model.n_layers):
        assert fits[layer] == (layer >= first), f"presence at block {layer}"
        assert r[layer][rest].quantile(0.99) < 3.0, f"spurious outliers at block {layer}"
        if layer >= first:
            assert r[layer][sel].min() >= 10.0, f"block {layer}: {r[layer][sel].min():.1f}"
            assert (r[layer].flatten(1).max(1).values >= 10).all()
    assert 0.5 * truth.expected_norm_ratio < r[first][sel].median() < 2 * truth.expected_norm_ratio


@pytest.mark.parametrize("name", NEW)
def test_zeroing_causal_units_removes_the_outliers_everywhere(fixtures, name: str) -> None:
    model, truth, x = fixtures(name)
    norms = patch_norms(model, x, truth.causal_units)
    assert not any(present(norms).values())
    first = truth.emergence_layer
    control = vitreg.wrap(build_unplanted(name, img_size=SIZE))
    ctrl = ratios(patch_norms(control, x))[first].max().item()
    zeroed = ratios(norms)[first].max().item()
    assert 1 / 1.5 < zeroed / ctrl < 1.5, (zeroed, ctrl)


@pytest.mark.parametrize("name", NEW)
def test_zeroing_readers_or_distractors_keeps_the_outliers(fixtures, name: str) -> None:
    model, truth, x = fixtures(name)
    sel, _ = masks(truth, x)
    full = patch_norms(model, x)
    first = truth.emergence_layer
    no_readers = patch_norms(model, x, truth.reader_units)
    assert all(present(no_readers)[i] for i in range(first, model.n_layers))
    # readers reinforce: without them the last block's outliers are clearly weaker
    last = model.n_layers - 1
    gain = full[last][sel].median() / no_readers[last][sel].median()
    assert gain > 1.15
    assert torch.equal(no_readers[first], full[first])
    if truth.distractor_units:
        no_distractors = patch_norms(model, x, truth.distractor_units)
        assert all(present(no_distractors)[i] for i in range(first, model.n_layers))
        for i in range(first, model.n_layers):  # the outlier tokens themselves do not change
            change = (no_distractors[i][sel] / full[i][sel] - 1).abs().max()
            assert change < 0.05, (i, change)


def test_multiblock_weak_units_add_up_to_the_outliers(fixtures) -> None:
    """Weak units of blocks 2-3 (flat patches at ~2.5x, no outlier mode) and strong units of
    block 4 all write along the outlier direction: every one of the 6 is needed."""
    model, truth, x = fixtures("dinov2_s14_multiblock")
    sel, _ = masks(truth, x)
    first = truth.emergence_layer
    causal = list(truth.causal_units)
    weak = [c for c in causal if c[0] < first]
    assert sorted({layer for layer, _ in weak}) == [2, 3] and len(weak) == 4

    def flat(zero=()) -> tuple[dict[int, float], dict]:
        """Median ratio of the selected patches and the presence fit, per block."""
        norms = patch_norms(model, x, zero)
        r = ratios(norms)
        fits = {i: bimodal_fit(n.numpy()) for i, n in norms.items()}
        return {i: r[i][sel].median().item() for i in r}, fits

    full, fits = flat()
    ordinary, _ = flat(causal)  # the selected patches with no causal unit: ~0.85
    # the weak units: flat patches well above ordinary at block 3, but no outlier mode
    assert 2.2 < full[3] < 2.8, full[3]
    for layer in (2, 3):
        assert not fits[layer].present and fits[layer].mode_ratio < 2.85, fits[layer]
    assert fits[first].present and full[first] > 20
    # the block-4 units alone removed: no mode at block 4, flat patches still far above ordinary
    # (the readers of blocks 6-9 fire on the weak units' v and rebuild a mode later)
    no_strong, no_strong_fits = flat([c for c in causal if c[0] == first])
    assert not any(no_strong_fits[i].present for i in range(first + 2))
    assert no_strong[first] > 2 * ordinary[first]
    assert no_strong_fits[model.n_layers - 2].present
    # the weak units removed: much weaker outliers (the strong units lose part of their input)
    no_weak, _ = flat(weak)
    assert no_weak[first] < 0.5 * full[first], (no_weak[first], full[first])
    # any one weak unit zeroed (the others active): lower outliers, by about equal amounts
    drops = [full[first] - flat([u])[0][first] for u in weak]
    assert min(drops) > 0.005 * full[first], drops
    assert max(drops) < 2 * min(drops), drops
    # any one weak unit alone (the other 5 causal units zeroed): flat patches above ordinary
    for u in weak:
        alone, _ = flat([c for c in causal if c != u])
        assert alone[first] >= 1.15 and alone[first] >= 1.15 * ordinary[first], (u, alone)


@pytest.mark.parametrize("name", NEW)
def test_units_fire_where_their_role_says(fixtures, name: str) -> None:
    model, truth, x = fixtures(name)
    sel, rest = masks(truth, x)
    _, cache = model.run_with_cache(x, names="blocks.*.mlp.hook_post")

    def acts(layer: int, unit: int) -> torch.Tensor:
        return cache[f"blocks.{layer}.mlp.hook_post"][..., unit]  # [B, T]

    layout = cache.layout("blocks.0.mlp.hook_post")
    for layer, unit in truth.units:
        a = layout.take(acts(layer, unit), "patches").reshape(sel.shape)
        assert a[sel].min() > 5.0 and a[rest].abs().max() < 0.1, (layer, unit)
        assert layout.take(acts(layer, unit), "prefix").abs().max() < 0.1
    for layer, unit, kind in truth.distractor_units:
        a = acts(layer, unit)
        patches = layout.take(a, "patches").reshape(sel.shape)
        cls = layout.take(a, "cls")
        assert patches[sel].abs().max() < 0.1  # never on the outlier tokens
        if kind == "cls":
            assert cls.min() > 100 and patches.abs().max() < 0.1
        else:
            assert patches[rest].min() > 10


@pytest.mark.parametrize("name", NEW)
def test_readers_top_the_mean_activation_on_outliers_ranking(fixtures, name: str) -> None:
    """The paper's Algorithm 1 score (mean |activation| over outlier tokens), over all blocks,
    ranks the readers first: a selection by this score alone picks readers, not causes."""
    model, truth, x = fixtures(name)
    sel, _ = masks(truth, x)
    _, cache = model.run_with_cache(x, names="blocks.*.mlp.hook_post")
    scores = {}
    for layer in range(model.n_layers):
        a = cache.patches(f"blocks.{layer}.mlp.hook_post")
        for unit, s in enumerate(a[sel].abs().mean(0).tolist()):
            scores[(layer, unit)] = s
    ranked = sorted(scores, key=scores.get, reverse=True)
    readers = set(truth.reader_units)
    assert set(ranked[: len(readers)]) == readers
    assert min(scores[u] for u in readers) > 2 * max(scores[u] for u in truth.causal_units)


def reader_acts(model: vitreg.Model, truth, x: torch.Tensor, zero) -> dict:
    """Each reader's activations ``[B, T]`` with the ``(layer, unit)`` pairs zeroed."""
    by_layer: dict[int, list[int]] = {}
    for layer, unit in zero:
        by_layer.setdefault(layer, []).append(unit)
    with model.hooks([(f"blocks.{i}.mlp.hook_post", _zero(u)) for i, u in by_layer.items()]):
        _, cache = model.run_with_cache(x, names="blocks.*.mlp.hook_post")
    return {(i, u): cache[f"blocks.{i}.mlp.hook_post"][..., u] for i, u in truth.reader_units}


@pytest.mark.parametrize("name", NEW)
def test_readers_need_outliers(fixtures, name: str) -> None:
    """With the causal units zeroed, the readers stay silent."""
    model, truth, x = fixtures(name)
    for unit, a in reader_acts(model, truth, x, truth.causal_units).items():
        assert a.abs().max() < 0.1, unit


def test_multiblock_readers_fire_on_the_weak_units_v(fixtures) -> None:
    """The readers read the cosine with v: the weak units alone (flat patches at ~2.5x, mostly
    along v) are enough for them to fire, at a good part of their full activation."""
    model, truth, x = fixtures("dinov2_s14_multiblock")
    sel, _ = masks(truth, x)
    layout = model.layout
    strong = [c for c in truth.causal_units if c[0] == truth.emergence_layer]
    full = reader_acts(model, truth, x, [])
    weak_only = reader_acts(model, truth, x, strong)
    for unit in truth.reader_units:
        on = [layout.take(a[unit], "patches").reshape(sel.shape)[sel] for a in (full, weak_only)]
        assert on[1].median() > 0.5 * on[0].median(), unit


def test_build_is_deterministic_and_small_sizes_work() -> None:
    a, ta = build("dinov2_s14_multiblock", img_size=56, seed=0)
    b, tb = build("dinov2_s14_multiblock", img_size=56, seed=0)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa) and ta == tb
    _, tc = build("dinov2_s14_multiblock", img_size=84, seed=1)
    assert tc.causal_units != ta.causal_units and tc.emergence_layer == 4
    # which units play which role depends on the seed, not on the image size
    assert build("dinov2_s14_multiblock", img_size=112)[1].distractor_units == ta.distractor_units


# the old fixtures are unchanged by the roles refactor ---------------------------------------
# What is exact is pinned exactly: the plan (planted and helper units, layers, token rule, every
# tensor's name and shape) as a digest of integers and strings. What a float calibration forward
# computes is pinned with a tolerance: its bits depend on the CPU's kernels and thread count, so a
# float digest pinned on one machine cannot hold on another.
def plan_digest(module: torch.nn.Module, truth) -> str:
    """Short sha256 of a fixture's integer plan: units, helpers, layers, rule, tensor shapes."""
    shapes = [(k, tuple(v.shape)) for k, v in module.state_dict().items()]
    plan = (truth.units, truth.helper_units, truth.layers, truth.first_outlier_layer, truth.rule)
    return hashlib.sha256(repr((*plan, shapes)).encode()).hexdigest()[:16]


def weight_norms(module: torch.nn.Module, truth) -> dict[str, float]:
    """L2 norms of the planted and helper blocks' MLP weights, and of the whole state dict."""
    layers = {layer for layer, *_ in truth.units} | {layer for layer, *_ in truth.helper_units}
    sd = module.state_dict()
    norms = {
        k: float(v.double().norm())
        for k, v in sd.items()
        if k.endswith("weight") and any(k.startswith(f"blocks.{i}.mlp.") for i in layers)
    }
    norms["total"] = sum(float(v.double().norm()) for v in sd.values())
    return norms


# measured before the refactor; the norms to 1e-4 relative
OLD_FIXTURES = {
    ("dinov2_s14", 56): (
        "2c6395ec26bfb2ee",
        3934.528,
        {6: (94.0914, 28.2573), 7: (40.8295, 25.2963)},
    ),
    ("dinov2_s14_reg4", 56): (
        "bb22532a8c59c97c",
        3944.972,
        {6: (81.9528, 31.772), 7: (40.7067, 25.5067)},
    ),
    ("dinov2_s14_swiglu", 56): (
        "8442f324216e2a2e",
        3908.546,
        {5: (79.1992, 31.681), 6: (46.4109, 26.3068)},
    ),
    ("clip_b16", 64): (
        "cb686026e7aa41bc",
        4301.926,
        {6: (108.8289, 10.7061), 7: (56.5229, 9.2166)},
    ),
    ("deit3_s16", 64): (
        "82a0f503e532e3b4",
        4044.829,
        {5: (92.1589, 28.7599), 6: (41.0645, 25.7614)},
    ),
}


@pytest.mark.parametrize("name,size", list(OLD_FIXTURES))
def test_old_fixtures_keep_their_plan_and_weights(name: str, size: int) -> None:
    module, truth = build(name, img_size=size, seed=0)
    digest, total, planted = OLD_FIXTURES[(name, size)]
    assert plan_digest(module, truth) == digest
    norms = weight_norms(module, truth)
    assert norms["total"] == pytest.approx(total, rel=1e-4)
    for layer, (fc1, fc2) in planted.items():
        assert norms[f"blocks.{layer}.mlp.fc1.weight"] == pytest.approx(fc1, rel=1e-4)
        assert norms[f"blocks.{layer}.mlp.fc2.weight"] == pytest.approx(fc2, rel=1e-4)
