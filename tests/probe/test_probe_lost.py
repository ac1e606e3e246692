"""LOST finds a planted foreground blob in synthetic patch features."""

import numpy as np
import pytest
import torch

from vitreg.errors import InputError
from vitreg.probe.lost import lost

D = 16


def scene(blobs: list[tuple[int, int, int, int]], seed: int = 0) -> torch.Tensor:
    """8×8 grid: background along one direction, foreground blocks (r0, r1, c0, c1 exclusive) along
    another, slightly anti-correlated with the background, plus noise."""
    g = torch.Generator().manual_seed(seed)
    u, v = torch.zeros(D), torch.zeros(D)
    u[0], v[1] = 1.0, 1.0
    f = u.expand(8, 8, D).clone()
    for r0, r1, c0, c1 in blobs:
        f[r0:r1, c0:c1] = v - 0.3 * u
    return f + 0.05 * torch.randn(8, 8, D, generator=g)


def test_lost_finds_planted_blob() -> None:
    feats = scene([(2, 5, 3, 6)])
    result = lost(feats, patch_size=16)
    assert 2 <= result.seed[0] < 5 and 3 <= result.seed[1] < 6
    expected = np.zeros((8, 8), bool)
    expected[2:5, 3:6] = True
    np.testing.assert_array_equal(result.mask, expected)
    np.testing.assert_array_equal(result.box, [48, 32, 96, 80])  # x0, y0, x1, y1 in pixels
    small_k = lost(feats.reshape(64, D), patch_size=16, grid=(8, 8), k=3)
    np.testing.assert_array_equal(small_k.box, result.box)
    assert len(small_k.seeds) <= 3


def test_box_is_the_seed_component_only() -> None:
    a, b = (0, 2, 0, 2), (5, 8, 5, 8)
    result = lost(scene([a, b], seed=1), patch_size=(10, 20))
    assert result.mask.sum() == 4 + 9  # both blobs correlate with the seed set
    boxes = {(0.0, 0.0, 40.0, 20.0), (100.0, 50.0, 160.0, 80.0)}
    assert tuple(result.box.tolist()) in boxes
    assert result.component.sum() in (4, 9)


def test_bias_shifts_affinity() -> None:
    feats = scene([(2, 5, 3, 6)])
    everything = lost(feats, patch_size=16, bias=1.5)  # all affinities positive → whole image
    np.testing.assert_array_equal(everything.box, [0, 0, 128, 128])
    clipped = lost(feats, patch_size=16, bias=1.5, image_size=(100, 120))
    np.testing.assert_array_equal(clipped.box, [0, 0, 120, 100])
    alone = lost(feats, patch_size=16, bias=-5.0)  # nothing positive → the seed patch alone
    assert alone.mask.sum() == 1 and alone.box[2] - alone.box[0] == 16


def test_bad_shapes_are_input_errors() -> None:
    with pytest.raises(InputError, match="grid"):
        lost(torch.randn(64, D), patch_size=16)
    with pytest.raises(InputError, match="grid"):
        lost(torch.randn(60, D), patch_size=16, grid=(8, 8))
