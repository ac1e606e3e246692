"""The all-images check of the automatic path pools the held-out norms calibration traced with
the chosen fix: the same pooled norms per block and the same presence test as tracing every
image again; and held-out images with no outlier patch give way to discovery images with some."""

import copy

import pytest
import torch

import vitreg
from vitreg.analysis.norms import norm_report
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.neurons.auto import HOLD_OUT, find_neurons, first_images, held_out_images
from vitreg.neurons.calibrate import calibrate_top_k, confirm_on, pooled
from vitreg.neurons.detection import choose_detection
from vitreg.neurons.held_out import HeldOutSplit
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build
from vitreg.testing.planted.plant_family import random_circuit, sample

SIZE = 112


def _dinov2():
    module, truth = build("dinov2_s14", img_size=SIZE)
    images = truth.normalize(synthetic_images(48, size=SIZE, seed=3, flat_fraction=0.1))
    return vitreg.wrap(module), truth, images


def _family(seed: int):
    module, truth = random_circuit(None, seed)
    size = sample(seed).img_size
    images = truth.normalize(synthetic_images(48, size=size, seed=seed + 1000, flat_fraction=0.1))
    return vitreg.wrap(module), truth, images


@pytest.mark.parametrize("planted", [_dinov2, lambda: _family(3)], ids=["dinov2_s14", "family3"])
def test_the_pooled_check_is_the_all_images_check(planted):
    model, truth, images = planted()
    disc, held = held_out_images(images, 32, held_out=False), held_out_images(images)
    d = choose_detection(model, HeldOutSplit(images, held_out=False), batch_size=16)
    recorded = {
        "detect_layer": d.detect_layer,
        "threshold": d.threshold,
        "threshold_value": d.threshold_value,
    }
    causes = sorted(truth.causal_units)
    left = {}
    for name, units in (("all causes", causes), ("one cause", causes[:1])):
        fix = NeuronSet.from_pairs(units, model)
        fix.settings = dict(recorded)
        _, curve = calibrate_top_k(model, fix, held, ks=(0, len(fix)), batch_size=16, keep_all=True)
        curve.status = "clean"  # so that a mode left turns it partial in both
        traced = curve.traced()
        assert traced is not None and traced.n_images == len(held)
        with TestTimeRegisters(fix).applied(model):
            every = norm_report(model, torch.cat([disc, held]), batch_size=16).trace
            mine = norm_report(model, disc, batch_size=16).trace
        both = pooled(mine, traced)
        for site in every.norms:
            torch.testing.assert_close(both.norms[site], every.norms[site], rtol=1e-6, atol=0)
        before = copy.deepcopy(curve)
        old = confirm_on(model, fix, torch.cat([disc, held]), before, batch_size=16)
        new = confirm_on(model, fix, disc, curve, batch_size=16, traced=traced)
        assert new == old, name
        assert (curve.status, curve.notes) == (before.status, before.notes)
        left[name] = new
    assert left["all causes"] == [] and left["one cause"], left


def test_a_moved_image_changes_side():
    x = torch.arange(12.0).view(12, 1, 1, 1)
    held = HeldOutSplit(x, held_out=True)
    disc = HeldOutSplit(x, held_out=False)
    assert [held.source_index(i) for i in range(3)] == [3, 7, 11]
    assert [disc.source_index(i) for i in range(9)] == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    moved = frozenset({1, 7})
    ids = [int(v) for b in disc.moving(moved) for v in b.flatten()]
    assert ids == [0, 2, 4, 5, 6, 7, 8, 9, 10]
    assert held_out_images(x, moved=moved).flatten().tolist() == [1.0, 3.0, 11.0]
    first, held = first_images(x, 4, 2, moved)
    assert first.flatten().tolist() == [0.0, 2.0, 4.0, 5.0] and held.flatten().tolist() == [1, 3]


def test_held_out_images_without_outliers_give_way_to_discovery_images_with_some():
    """The held-out images (every 4th) are uniform noise with no outlier patch; some discovery
    images with outlier patches are held out instead, before discovery, and the path works."""
    module, truth = build("dinov2_s14", img_size=SIZE)
    model = vitreg.wrap(module)
    x = synthetic_images(32, size=SIZE, seed=3, flat_fraction=0.1)
    x[HOLD_OUT - 1 :: HOLD_OUT] = torch.rand(
        8, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0)
    )
    images = truth.normalize(x)
    found = find_neurons(model, images, batch_size=8)
    moved = found.notes[0]
    assert "held out instead, before discovery" in moved
    n = found.held_out.n_images - 8
    assert n >= 1 and found.discovery.n_images == 24 - n
    assert found.causal is not None and found.causal.baseline.n_outlier_patches > 0
    assert set(found.chosen.pairs()) == set(truth.causal_units)
    assert found.status == "clean"


def test_held_out_images_that_pass_the_test_unfixed_give_way_too():
    """Held-out images with outlier patches that the fix's own test already passes with no fix
    (no mode, max/median at the ordinary level) cannot judge a fix: carriers are held out
    instead, and the note says why; held-out images that fail it stay."""
    from dataclasses import replace

    from vitreg.neurons import auto
    from vitreg.neurons.detection import surveyed_detection
    from vitreg.settings.neurons import NeuronSearch

    module, truth = build("dinov2_s14", img_size=SIZE)
    model = vitreg.wrap(module)
    images = truth.normalize(synthetic_images(48, size=SIZE, seed=3, flat_fraction=0.1))
    first, held = first_images(images, auto.SURVEY_IMAGES, auto.MAX_HELD_OUT)
    detection, surveyed = surveyed_detection(model, first, n_images=32, batch_size=16, more=held)
    unfixed = auto._unfixed(model, held, detection, auto.TOLERANCE, 16, auto.SILENT)
    assert not unfixed.clean and auto._carries(unfixed, detection, 16).any()
    disc, n_disc = HeldOutSplit(images, held_out=False), 36
    search = NeuronSearch()
    assert auto._to_hold_out(disc, n_disc, surveyed, unfixed, detection, search, 16) == ([], "")
    passed = replace(unfixed, clean=True)
    moved, why = auto._to_hold_out(disc, n_disc, surveyed, passed, detection, search, 16)
    assert moved and all(i % HOLD_OUT != HOLD_OUT - 1 for i in moved)  # discovery images
    assert "passed the fix's own test with no fix" in why
    fixed = NeuronSearch(top_k=4)  # a fixed k is not chosen on held-out images: nothing moves
    assert auto._to_hold_out(disc, n_disc, surveyed, passed, detection, fixed, 16) == ([], "")
