"""Register-neuron discovery, neuron sets and top-k calibration against planted ground truth (the
fixes that use the neurons are tested in tests/fix/test_fix_ttr.py)."""

import pytest
import torch

import vitreg
from vitreg import VitregError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.neurons.discover import discover
from vitreg.settings.neurons import NeuronSearch
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build, build_unplanted
from vitreg.testing.tiny import timm_vit as build_timm

SIZE = 112
FAST = ["dinov2_s14", "dinov2_s14_reg4", "dinov2_s14_swiglu", "deit3_s16"]


@pytest.fixture(scope="module")
def images():
    return synthetic_images(24, size=SIZE, seed=3, flat_fraction=0.1)


@pytest.mark.parametrize("name", FAST)
def test_discovery_finds_exactly_the_planted_units_and_the_fix_removes_outliers(name, images):
    module, truth = build(name, img_size=SIZE)
    model = vitreg.wrap(module, spec=f"planted:{name}")
    # the paper's ranking over every planted layer (by default the search ends where outliers
    # emerge, which leaves out the second planted layer's readers)
    search = NeuronSearch(top_k=len(truth.units), highest_layer=truth.layers[-1])
    found = discover(model, images, search, batch_size=8)
    assert set(found.pairs()) == set(truth.units)  # precision = recall = 1 at k = #planted
    detect = found.settings["detect_layer"]
    value = found.settings["threshold_value"]
    site = f"blocks.{detect}.hook_resid_post"
    _, before = model.run_with_cache(images, names=site, reduce="norm")
    assert (before.layout(site).take(before[site], "patches") > value).float().mean() > 0.03
    with TestTimeRegisters(found).applied(model):
        _, after = model.run_with_cache(images, names=site, reduce="norm")
        lay = after.layout(site)
        patches = lay.take(after[site], "patches")
        assert (patches > value).float().mean() <= 0.01
        assert lay.take(after[site], "extra").min() > value  # the register carries the norm
    assert model.layout.n_extra == 0


def test_neuron_set_roundtrip_and_fit_checks(tmp_path, images):
    module, _ = build("dinov2_s14", img_size=SIZE)
    model = vitreg.wrap(module, spec="planted:dinov2_s14")
    found = discover(model, images, NeuronSearch(top_k=7), batch_size=8)
    path = found.save(tmp_path / "neurons")
    again = NeuronSet.load(path)
    assert again.pairs() == found.pairs() and again.fingerprint == found.fingerprint
    assert again.settings["detect_layer"] == found.settings["detect_layer"]
    other = vitreg.wrap(build_timm("dinov2_swiglu")[0], spec="timm:small-swiglu")
    with pytest.raises(VitregError, match="planted:dinov2_s14.*timm:small-swiglu"):
        TestTimeRegisters(found).apply(other)
    bad = NeuronSet([3], [99999], [1.0])
    with pytest.raises(VitregError, match="outside"):
        TestTimeRegisters(bad).apply(model)
    with pytest.raises(VitregError, match="no NeuronSet"):
        NeuronSet.load(tmp_path / "missing")


def test_model_without_outliers_is_told_so(images):
    model = vitreg.wrap(build_unplanted("dinov2_s14", img_size=SIZE))
    with pytest.raises(VitregError, match="no high-norm outliers"):
        discover(model, images, batch_size=8)


def test_builtin_dinov2_large_set():
    from types import SimpleNamespace

    from vitreg.neurons.builtin import builtin_neurons

    ns = builtin_neurons("timm:vit_large_patch14_dinov2.lvd142m")
    assert len(ns) == 45 and set(ns.by_layer()) == {12, 13, 14, 15, 16, 17}
    assert ns.by_layer()[17][:3] == [884, 133, 1427]
    large = SimpleNamespace(
        spec="timm:vit_large_patch14_dinov2.lvd142m", module=None, n_layers=24, d_mlp=4096
    )
    ns.check_fits(large)
    with pytest.raises(VitregError, match="no built-in"):
        builtin_neurons("timm:vit_small_patch14_dinov2.lvd142m")


def test_top_k_calibration_picks_the_planted_count(images):
    from vitreg.neurons.calibrate import calibrate_top_k

    module, truth = build("deit3_s16", img_size=SIZE)
    model = vitreg.wrap(module)
    ranked = discover(model, images[:16], NeuronSearch(top_k=12), batch_size=8)
    held_out = synthetic_images(8, size=SIZE, seed=11, flat_fraction=0.1)
    search = NeuronSearch(target=0.01)
    chosen, curve = calibrate_top_k(model, ranked, held_out, search, batch_size=8)
    # the smallest sufficient k: planted units only, at most all of them
    assert 1 <= curve.chosen_k == len(chosen) <= len(truth.units)
    assert set(chosen.pairs()) <= set(truth.units)
    rates = curve.outlier_rate[0]
    assert rates[0] > 0.03 and rates[-1] <= 0.01 and curve.ks[-1] == curve.chosen_k
    assert curve.max_norm[0][0] > 10 * curve.max_norm[0][-1] / 2
    assert chosen.settings["calibration"]["chosen_k"] == curve.chosen_k


def test_calibration_over_several_resolutions():
    from vitreg.neurons.calibrate import calibrate_top_k

    model = vitreg.load(
        "timm:vit_small_patch14_dinov2", pretrained=False, depth=3, dynamic_img_size=True
    )
    x = torch.randn(4, 3, 56, 56, generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(x, names="blocks.2.hook_resid_post", reduce="norm")
    value = float(cache["blocks.2.hook_resid_post"].quantile(0.9))
    ranked = NeuronSet(
        [1, 2, 0],
        [5, 6, 7],
        [3.0, 2.0, 1.0],
        settings={"detect_layer": 2, "threshold": "absolute", "threshold_value": value},
    )
    search = NeuronSearch(target=0.0)
    _, curve = calibrate_top_k(model, ranked, x, search, image_sizes=(56, 84), ks=(0, 1, 3))
    assert set(curve.outlier_rate) == {56, 84}
    assert len(curve.outlier_rate[56]) == len(curve.outlier_rate[84]) == len(curve.ks)
    # a random model keeps its top-decile tokens whatever the fix, but that threshold lies
    # inside the ordinary patches' tolerance band at both sizes: the rate is recorded and does
    # not decide, so the first k passes at every size
    assert all(not c.rate_decides for checks in curve.checks.values() for c in checks)
    assert curve.status == "clean" and curve.ks == [0, 1] and curve.chosen_k == 1
    assert curve.outlier_rate[56][0] == pytest.approx(0.1, abs=0.03)
    assert curve.outlier_rate[56][1] > search.target  # above the target, and passes
