"""A partial choice made again on more evidence: the surveyed discovery images its fix leaves
outlier patches on are held out too (first, so the causal check sees them), and the new choice
is given when it is clean on every image, or, partial too, when it leaves fewer outlier
patches."""

import pytest
import torch

import vitreg
from vitreg.analysis.rules import image_mask
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.neurons import auto
from vitreg.neurons.detection import surveyed_detection
from vitreg.progress import SILENT
from vitreg.settings.neurons import NeuronSearch
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build

SIZE = 112


@pytest.fixture(scope="module")
def planted():
    """The planted ViT-S/14, its truth, its images, the split and the survey's detection."""
    module, truth = build("dinov2_s14", img_size=SIZE)
    images = truth.normalize(synthetic_images(48, size=SIZE, seed=3, flat_fraction=0.1))
    model = vitreg.wrap(module)
    disc, _ = auto._discovery_split(images, None)
    first, held = auto.first_images(images, auto.SURVEY_IMAGES, auto.MAX_HELD_OUT)
    detection, _ = surveyed_detection(
        model, first, NeuronSearch(), n_images=auto.SURVEY_IMAGES, batch_size=16, more=held
    )
    return model, truth, disc, first, held, detection


_FIRST: dict = {}


def _first_choice(planted):
    """The choice among the first cause alone (partial), made once."""
    if not _FIRST:
        model, truth, _, first, held, detection = planted
        _FIRST["choice"] = _choice(model, first, held, sorted(truth.causal_units)[:1], detection)
    return _FIRST["choice"]


def _knobs() -> auto._Knobs:
    return auto._Knobs(auto.CAUSAL_IMAGES, auto.TOLERANCE, 16, SILENT)


def _ranking(model, units, detection) -> NeuronSet:
    """``units`` as discovery would rank them: with the survey's detection recorded."""
    ranking = NeuronSet.from_pairs(units, model)
    ranking.settings = {
        "detect_layer": detection.detect_layer,
        "threshold": detection.threshold,
        "threshold_value": detection.threshold_value,
    }
    return ranking


def _choice(model, first, held, units, detection):
    """The automatic path's choice among ``units`` (its causal check and calibration)."""
    knobs = _knobs()
    unfixed = auto._unfixed(model, held, detection, knobs.tolerance, 16, SILENT)
    ranking = _ranking(model, units, detection)
    search = NeuronSearch()
    return auto._choose(model, first, held, ranking, detection, search, True, knobs, unfixed)


def _outlier_patches(model, units, images, detection):
    """Per image: the patches above the survey's threshold at the detection block under the
    fix."""
    site = f"blocks.{detection.detect_layer}.hook_resid_post"
    with TestTimeRegisters(NeuronSet.from_pairs(units, model)).applied(model):
        _, cache = model.run_with_cache(images, names=site, reduce="norm")
    norms = cache.layout(site).take(cache[site], "patches")
    return image_mask(norms, detection.threshold, detection.threshold_value).sum(1)


def test_the_outlier_patches_a_fix_leaves_are_those_above_the_threshold(planted):
    model, truth, _, first, held, detection = planted
    causes = sorted(truth.causal_units)
    choice = _first_choice(planted)
    assert choice.curve.status == "partial"
    for units in ([], causes[:1], causes):
        chosen = NeuronSet.from_pairs(units, model)
        left = auto._left_on(model, chosen, first, detection, _knobs(), choice.curve)
        assert left.tolist() == _outlier_patches(model, units, first, detection).tolist()
    every = NeuronSet.from_pairs(causes, model)
    assert not auto._left_on(model, every, first, detection, _knobs(), choice.curve).any()
    none = NeuronSet.from_pairs([], model)
    assert auto._left_on(model, none, first, detection, _knobs(), choice.curve).any()


def test_a_rule_that_cuts_each_image_on_its_own_also_needs_the_calibration_bar(planted):
    """``robust`` flags a patch in most images even with every cause zeroed; the bar (1.5x the
    ordinary patches' max/median) keeps those images out."""
    model, truth, _, first, held, detection = planted
    causes = sorted(truth.causal_units)
    choice = _first_choice(planted)
    robust = detection.model_copy(update={"threshold": "robust", "threshold_value": None})
    every = NeuronSet.from_pairs(causes, model)
    assert _outlier_patches(model, causes, first, robust).any()
    assert not auto._left_on(model, every, first, robust, _knobs(), choice.curve).any()
    none = NeuronSet.from_pairs([], model)
    assert auto._left_on(model, none, first, robust, _knobs(), choice.curve).any()


def test_a_partial_choice_is_made_again_with_the_images_it_failed_on(planted):
    """A first choice with one cause leaves outliers on discovery images; with those held out
    too (first, at most half the causal images) the choice among every cause is clean."""
    model, truth, disc, first, held, detection = planted
    causes = sorted(truth.causal_units)
    choice = _first_choice(planted)
    ranking = _ranking(model, causes, detection)
    search = NeuronSearch()
    found = auto._with_left(model, first, held, ranking, detection, search, _knobs(), choice, disc)
    left = _outlier_patches(model, causes[:1], first, detection).nonzero().flatten()
    moved = left[: auto.CAUSAL_IMAGES // 2]
    assert len(moved) >= 1
    assert torch.equal(found.held[: len(moved)], first[moved])
    assert torch.equal(found.held[len(moved) :], held)
    assert found.given and found.choice is not None
    assert sorted(found.choice.chosen.pairs()) == causes
    named = [disc.source_index(int(j)) for j in moved]
    assert str(named) in found.note and "is the one given" in found.note


def test_nothing_is_made_again_where_the_fix_leaves_no_outlier_patch(planted):
    model, truth, disc, first, held, detection = planted
    causes = sorted(truth.causal_units)
    choice = _choice(model, first, held, causes, detection)
    ranking = _ranking(model, causes, detection)
    found = auto._with_left(
        model, first, held, ranking, detection, NeuronSearch(), _knobs(), choice, disc
    )
    assert found.choice is None and not found.given and found.note == ""


@pytest.mark.parametrize("second", ["fewer", "as many"])
def test_a_second_partial_choice_is_given_when_it_leaves_fewer_outlier_patches(
    planted, monkeypatch, second
):
    """A second choice that is partial too is given only when its fix leaves fewer outlier
    patches on all the images than the first's: every cause (said partial here) against the
    first choice's one cause again."""
    model, truth, disc, first, held, detection = planted
    causes = sorted(truth.causal_units)
    choice = _first_choice(planted)
    if second == "fewer":
        made = _choice(model, first, held, causes, detection)
        made.curve.status = "partial"
    else:
        made = choice
    monkeypatch.setattr(auto, "_choose", lambda *a, **k: made)
    ranking = _ranking(model, causes, detection)
    found = auto._with_left(
        model, first, held, ranking, detection, NeuronSearch(), _knobs(), choice, disc
    )
    every = torch.cat([first, held])
    then = int(_outlier_patches(model, causes[:1], every, detection).sum())
    now = int(_outlier_patches(model, made.chosen.pairs(), every, detection).sum())
    assert found.given == (now < then) == (second == "fewer"), (now, then)
    said = f"leaves {now} outlier patches on the {len(every)} images against the first's {then}"
    assert said in found.note
