"""The automatic register-neuron path against planted ground truth: it chooses the units that
create the outliers, and the fix it makes leaves no artifact at any block (a criterion it was
not tuned on), judged on images it never saw."""

import pytest
import torch

import vitreg
from vitreg import InputError, VitregError
from vitreg.analysis.norms import norm_report
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.models.input_size import enable_dynamic_size
from vitreg.neurons.auto import HOLD_OUT, find_neurons
from vitreg.neurons.detection import choose_detection
from vitreg.neurons.discover import discover
from vitreg.neurons.stability import other_sizes
from vitreg.results.neurons import Calibration, Causal, Discovered, HeldOut
from vitreg.settings.neurons import NeuronSearch
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build, build_unplanted

SIZE = 112
FIXTURES = ["dinov2_s14", "dinov2_s14_early", "dinov2_s14_multiblock", "deit3_s16"]


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return synthetic_images(32, size=SIZE, seed=3, flat_fraction=0.1)


@pytest.fixture(scope="module")
def fresh() -> torch.Tensor:
    """Images neither discovery nor calibration saw: the independent check."""
    return synthetic_images(8, size=SIZE, seed=99, flat_fraction=0.1)


def planted(name: str):
    module, truth = build(name, img_size=SIZE)
    return vitreg.wrap(module, spec=f"planted:{name}"), truth


def max_over_median(model, x: torch.Tensor, layer: int) -> float:
    site = f"blocks.{layer}.hook_resid_post"
    _, cache = model.run_with_cache(x, names=site, reduce="norm")
    patches = cache.layout(site).take(cache[site], "patches")
    return float(patches.max() / patches.median())


@pytest.mark.parametrize("name", FIXTURES)
def test_automatic_path_chooses_the_causes_and_leaves_no_artifact(name, images, fresh):
    model, truth = planted(name)
    found = find_neurons(model, images, batch_size=8)
    chosen = set(found.chosen.pairs())
    assert chosen == set(truth.causal_units)  # precision = recall = 1
    assert not chosen & set(truth.reader_units)
    assert not chosen & {(lay, u) for lay, u, _ in truth.distractor_units}
    assert found.status == "clean" and found.held_out.blocks_with_outlier_mode_after == []
    assert found.detection.emergence_layer == truth.emergence_layer
    # the result is the typed results model itself; the sets ride along unserialised
    assert isinstance(found, Discovered) and isinstance(found.held_out, HeldOut)
    assert isinstance(found.causal, Causal) and isinstance(found.calibration, Calibration)
    assert found.causal.units() == found.chosen.pairs()
    assert Discovered.model_validate(found.model_dump()) == Discovered(**dict(found))
    assert "chosen" not in found.model_dump() and found.split["n_held_out"] == 8
    # the searched range reaches where the outliers are written, the readers' blocks included
    d = found.detection
    assert truth.emergence_layer <= d.highest_layer <= d.detect_layer
    # the independent criterion on unseen images: the diagnose verdict at every block
    with TestTimeRegisters(found.chosen).applied(model):
        report = norm_report(model, fresh, batch_size=8).summary
        fixed = max_over_median(model, fresh, found.detection.detect_layer)
    assert not report.artifacts_present
    assert not any(lo.artifacts_present for lo in report.layers)
    control = vitreg.wrap(build_unplanted(name, img_size=SIZE))
    assert fixed <= 1.5 * max_over_median(control, fresh, found.detection.detect_layer)


def test_a_top_k_beyond_the_candidates_is_refused(images):
    model, _ = planted("dinov2_s14")
    with pytest.raises(InputError, match=r"--top-k 100000 .* hold 12288 MLP units \(8 x 1536\)"):
        find_neurons(model, images, NeuronSearch(top_k=100000), batch_size=8)
    found = find_neurons(model, images, NeuronSearch(top_k=3), batch_size=8)
    assert found.n_neurons == 3 and found.top_k_mode == "fixed"


def test_each_choice_has_its_reason(images):
    model, truth = planted("dinov2_s14")
    d = choose_detection(model, images[:16], batch_size=8)
    assert d.emergence_layer == truth.first_outlier_layer
    # searched up to where the outliers still grow: the reinforcing readers' block 7 is in
    assert d.emergence_layer <= d.highest_layer <= d.detect_layer
    assert "grows by at least" in d.reasons["highest_layer"]
    assert [g.layer for g in d.growth] == list(range(model.n_layers))
    assert (
        d.detect_layer != model.n_layers - 1
        and "last block is passed over" in d.reasons["detect_layer"]
    )
    assert "first appear at the output of block 6" in d.reasons["highest_layer"]
    assert d.threshold == "auto" and d.threshold_value > 0 and "valley" in d.reasons["threshold"]
    assert [x.outlier_mode for x in d.layers] == [i >= 6 for i in range(model.n_layers)]
    search = NeuronSearch(detect_layer=-2, highest_layer=7)
    given = choose_detection(model, images[:16], search, batch_size=8)
    assert (given.detect_layer, given.highest_layer) == (10, 7)
    assert given.reasons["detect_layer"].endswith("given")
    with pytest.raises(InputError, match="outside a 12-block model"):
        choose_detection(model, images[:8], NeuronSearch(detect_layer=99), batch_size=8)


def test_models_without_outliers_are_refused(images):
    model = vitreg.wrap(build_unplanted("dinov2_s14", img_size=SIZE))
    with pytest.raises(VitregError, match="no high-norm outliers"):
        find_neurons(model, images[:16], batch_size=8)


def test_a_range_without_the_writers_says_so_and_a_short_set_is_partial(images):
    model, truth = planted("dinov2_s14")
    with pytest.raises(VitregError, match="no candidate unit in blocks 0-5"):
        find_neurons(model, images[:16], NeuronSearch(highest_layer=5), batch_size=8)
    found = find_neurons(model, images[:16], NeuronSearch(top_k=1), batch_size=8)
    assert found.status == "partial" and found.top_k_mode == "fixed"
    assert found.held_out.blocks_with_outlier_mode_after  # one unit of three is not enough
    assert "partial" in found.notes[0] and found.calibration is None


def test_discover_honours_a_highest_layer_above_the_detection_layer(images):
    model, truth = planted("dinov2_s14")
    value = choose_detection(model, images[:16], batch_size=8).threshold_value
    deep = discover(
        model, images, NeuronSearch(detect_layer=6, threshold=value, highest_layer=8, top_k=8)
    )
    assert deep.settings["highest_layer"] == 8 and deep.settings["detect_layer"] == 6
    # units after the detection layer are scored on the outliers found there: the readers of
    # block 7 rank with the writers of block 6, as in the official code's all-layer ranking
    assert set(truth.units) <= set(deep.pairs())
    capped = discover(model, images, NeuronSearch(detect_layer=6, threshold=value, top_k=8))
    assert set(capped.layers) <= set(range(7))


def test_stability_compares_the_sets_of_two_halves_of_the_images(images):
    model, truth = planted("dinov2_s14")
    with pytest.raises(
        InputError, match="cannot check the fix at 140 px: this model takes 112x112"
    ):
        find_neurons(model, images, batch_size=8, check_sizes=[140])  # before any work
    enable_dynamic_size(model.module)
    found = find_neurons(model, images, batch_size=8, stability=True, check_sizes=[140])
    s = found.stability
    assert [set(map(tuple, h)) for h in s.halves] == [set(truth.causal_units)] * 2
    assert s.overlap_between_halves == 1.0 and s.overlap_with_whole == [1.0, 1.0]
    # the set found at 112 px cleans 140 px too (the plant fires on flat patches at any size)
    sizes = found.other_sizes
    (row,) = sizes.sizes
    assert row.img_size == 140 and sizes.clean_at_every_size and row.clean_after
    assert row.blocks_with_outlier_mode_before and not row.blocks_with_outlier_mode_after
    assert row.max_over_median_after < row.max_over_median_before / 5
    # one unit of the three leaves outliers at 140 px: said, not hidden
    held = images[HOLD_OUT - 1 :: HOLD_OUT]
    search = NeuronSearch(target=0.01)
    one = other_sizes(model, found.chosen.first(1), held, [140], search, tolerance=1.5)
    assert not one.clean_at_every_size and one.sizes[0].blocks_with_outlier_mode_after
    plain = find_neurons(model, images, batch_size=8)
    assert plain.stability is None and plain.other_sizes is None  # opt-in
