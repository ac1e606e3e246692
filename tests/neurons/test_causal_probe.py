"""The causal probe's exact excess: a pass that replays the blocks before its first zeroed unit
reports, at those blocks, the excess they really have (unchanged from the base run), and at the
blocks it runs the same excess as a pass that runs every block."""

from __future__ import annotations

import pytest
import torch

from vitreg.models.wrapping import wrap
from vitreg.neurons.causal import CausalProbe
from vitreg.neurons.detection import choose_detection
from vitreg.testing import make_synthetic, random_circuit
from vitreg.testing.planted import sample

SEED = 0  # dinov2, writers in blocks 3-5: measured from block 3, zeroed units up to block 5


def _probe(model, images, detection, candidates) -> CausalProbe:
    return CausalProbe(
        model,
        images,
        detection.detect_layer,
        detection.threshold,
        detection.threshold_value,
        candidates,
        batch_size=8,
        first_layer=0,
    )


@pytest.fixture(scope="module")
def setting():
    module, truth = random_circuit(None, SEED)
    s = sample(SEED)
    model = wrap(module)
    images = truth.normalize(make_synthetic(16, s.img_size, SEED + 1000, 0.25).images)
    detection = choose_detection(model, images, n_images=16, batch_size=8)
    return model, images, detection, list(truth.causal_units)


def test_a_replayed_pass_reports_each_blocks_own_excess(setting) -> None:
    model, images, detection, causes = setting
    late = max(causes)  # a unit of the last writing block: the blocks before it are replayed
    probe = _probe(model, images, detection, causes)
    base = probe.measure([], grad=True)
    replayed = probe.measure([late])
    assert probe.replay.start(late[0]) == late[0] > 1  # the pass did skip blocks
    # every block the pass did not run keeps the base excess, not the replayed block's
    for block in probe.blocks:
        if block < late[0]:
            assert replayed.excess[block] == base.excess[block], block
    # and the blocks it ran agree with a pass that runs every block (with gradients)
    full = _probe(model, images, detection, causes).measure([late], grad=True)
    for block in probe.blocks:
        assert replayed.excess[block] == pytest.approx(full.excess[block], abs=1e-4), block
    assert replayed.excess[detection.detect_layer] < base.excess[detection.detect_layer]
    assert torch.isfinite(torch.tensor(list(replayed.excess.values()))).all()
