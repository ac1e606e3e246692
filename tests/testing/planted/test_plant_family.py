"""The randomised plant family (issue 18): every sampled circuit does what its ground truth says,
the seeds cover the cases the issue names, and the automatic path is scored on them."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from vitreg.errors import InputError
from vitreg.experiment.plant_family import CircuitScore
from vitreg.testing import random_circuit, random_unplanted
from vitreg.testing.images import make_synthetic
from vitreg.testing.planted import ARCHS, FEATURED, RULES, check_circuit, sample

SEEDS = range(20)


def test_seeds_cover_the_family() -> None:
    """Seeds 0-19 draw every architecture, rule and case; each featured seed has its case."""
    samples = [sample(seed) for seed in SEEDS]
    assert {s.arch for s in samples} == set(ARCHS)
    assert {s.rule for s in samples} == set(RULES)
    assert {s.options.sinks for s in samples} == {True, False}
    assert {s.options.directions for s in samples} == {1, 2, 3}
    roles = Counter(gr.role for s in samples for gr in s.groups)
    assert all(roles[r] for r in ("cause", "reader", "texture", "cls", "position")), roles

    def causes(s):
        return [gr for gr in s.groups if gr.role == "cause"]

    n_causal = [sum(gr.n for gr in causes(s)) for s in samples]
    assert min(n_causal) >= 2 and max(n_causal) == 40
    for s in samples:
        layers = [gr.layer for gr in causes(s)]
        assert 1 <= len(set(layers)) <= 4 and min(layers) >= 2
        assert 7 <= s.depth <= 9 and 96 <= s.width <= 192 and 56 <= s.img_size <= 96
        final = max(causes(s), key=lambda gr: gr.layer).target
        assert 4.0 <= final <= 25.0
    # the featured seeds
    emergence = [min(gr.layer for gr in causes(s) if gr.target >= 4) for s in samples]
    after = [max(gr.layer for gr in causes(s)) - e for s, e in zip(samples, emergence, strict=True)]
    assert after[0] == 2 and samples[0].arch == "dinov2" and samples[0].rule == "flat"
    assert n_causal[1] == 40
    weak = [sum(gr.n for gr in causes(samples[2]) if gr.target < 4)]
    assert n_causal[2] == 32 and weak[0] >= 20  # most units create nothing alone
    assert samples[3].arch == "siglip" and not any(gr.role == "cls" for gr in samples[3].groups)
    assert not samples[4].options.sinks and after[4] >= 1
    assert set(FEATURED) == {0, 1, 2, 3, 4}
    assert sum(a > 0 for a in after) >= 5  # writers after emergence are common, not only seed 0


def test_sampling_is_deterministic_and_ranges_override() -> None:
    assert sample(7) == sample(7) and sample(7) != sample(8)
    s = sample(11, arch="clip", causal=(3, 3), blocks=(1, 1), readers=(0, 0), rules=("flat",))
    assert s.arch == "clip" and s.rule == "flat"
    assert [(gr.role, gr.n) for gr in s.groups if gr.role in ("cause", "reader")] == [("cause", 3)]
    with pytest.raises(InputError, match="unknown plant-family range"):
        sample(0, depths=(6, 6))
    with pytest.raises(InputError, match="unknown plant-family architecture"):
        sample(0, arch="swin")


@pytest.mark.parametrize("seed", SEEDS)
def test_every_sampled_circuit_does_what_its_truth_says(seed: int) -> None:
    module, truth = random_circuit(seed=seed)
    s = sample(seed)
    images = make_synthetic(12, s.img_size, seed=7, flat_fraction=0.4).images
    check = check_circuit(module, truth, truth.normalize(images), random_unplanted(seed=seed))
    assert check.ok, (check.failures, check.figures)
    # the truth says what was sampled
    causes = [gr for gr in s.groups if gr.role == "cause"]
    assert len(truth.causal_units) == sum(gr.n for gr in causes)
    assert truth.writer_layers == tuple(sorted({gr.layer for gr in causes}))
    assert min(layer for layer, _ in truth.reader_units or [(99, 0)]) > truth.emergence_layer
    assert truth.sink_layers == (
        tuple(range(truth.emergence_layer + 1, s.depth)) if s.options.sinks else ()
    )
    d = json.loads(json.dumps(truth.model_dump(mode="json")))
    assert d["writer_layers"] == list(truth.writer_layers) and d["rule"]["text"]


def test_build_is_deterministic_and_the_unplanted_twin_shares_the_weights() -> None:
    a, ta = random_circuit(seed=6)
    b, tb = random_circuit(seed=6)
    sa, sb = a.state_dict(), b.state_dict()
    assert ta == tb and all(torch.equal(sa[k], sb[k]) for k in sa)
    twin = random_unplanted(seed=6)
    assert type(twin) is type(a) and len(twin.blocks) == len(a.blocks)
    # block 0's attention is neither planted nor reserved: the same random weights
    assert torch.equal(twin.blocks[0].attn.qkv.weight, a.blocks[0].attn.qkv.weight)
    assert not torch.equal(twin.blocks[0].mlp.fc2.weight, a.blocks[0].mlp.fc2.weight)


def test_the_check_catches_a_circuit_that_breaks_its_truth() -> None:
    """A causal unit relabelled as a reader: zeroing the 'causal' units leaves outliers."""

    module, truth = random_circuit(seed=7)
    s = sample(7)
    images = truth.normalize(make_synthetic(12, s.img_size, seed=7, flat_fraction=0.4).images)
    wrong = truth.model_copy(update={"causal_units": truth.causal_units[:1]})
    check = check_circuit(module, wrong, images, random_unplanted(seed=7))
    assert not check.ok and any("causal units zeroed" in f for f in check.failures)


# (b) the automatic path on the family -------------------------------------------------------
def _consistent(row: CircuitScore) -> None:
    """The numbers of a scored row agree with each other, whatever the outcome."""
    if row.outcome == "refused":
        assert row.error
        return
    assert 0.0 <= row.precision <= 1.0 and 0.0 <= row.recall <= 1.0
    assert row.n_chosen == len(row.chosen) and row.forwards > 0
    assert row.clean_on_fresh == (
        not row.blocks_with_mode_after
        and row.max_over_median_after <= 1.5 * row.unplanted_max_over_median
    )
    assert row.consistent == ((row.status == "clean") == row.clean_on_fresh)


def test_harness_scores_a_circuit_the_path_solves() -> None:
    """One single-block circuit (writers at the emergence block only): precision = recall = 1,
    clean on fresh images at every block, and the cost recorded."""
    from vitreg.experiment.plant_family import score_circuit

    row = score_circuit(18)
    assert isinstance(row, CircuitScore)
    _consistent(row)
    assert row.outcome == "exact", row
    assert row.readers_chosen == row.distractors_chosen == row.helpers_chosen == 0
    assert row.causal_passes > 0 and row.seconds > 0


@pytest.mark.slow
def test_the_selection_completes_writers_that_compensate() -> None:
    """A set that already cleans the outliers can leave out units that write them too (the
    weak writers of a block compensate for each other): the remaining candidates of the writing
    blocks, zeroed together with the set active, still remove excess, so those whose absence
    from that group costs a real share of it join. Without that step this circuit is clean with
    2 of its 25 causal units missed."""
    from vitreg.experiment.plant_family import score_circuit

    row = score_circuit(15)
    _consistent(row)
    assert row.outcome == "exact", row
    assert row.readers_chosen == row.distractors_chosen == row.helpers_chosen == 0


# seeds the path does not solve yet (benchmarks/plant_family.py); every other seed must meet the
# target
KNOWN = {
    1: "clean but misses 15 weak units of block 3 (40 causal units over blocks 2-5): their "
    "residual is below what the check can tell from noise once the rest is zeroed",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(s, marks=pytest.mark.xfail(strict=False, reason=KNOWN[s])) if s in KNOWN else s
        for s in SEEDS
    ],
)
def test_automatic_path_on_the_family(seed: int) -> None:
    """Target: the exact causal units and clean at every block; or a partial result that the
    fresh images confirm. Never a reader or a distractor. Clean with a few weak units missed
    (recall >= 0.9, nothing else chosen) also passes: whether the last weak unit of a group is
    needed sits at the check's resolution, where float rounding on another CPU can tip it."""
    from vitreg.experiment.plant_family import score_circuit

    row = score_circuit(seed)
    _consistent(row)
    nearly = row.outcome == "clean_incomplete" and row.precision == 1
    assert row.outcome in ("exact", "partial") or (nearly and row.recall >= 0.9), row
    assert row.readers_chosen == 0 and row.distractors_chosen == 0
