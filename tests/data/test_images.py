"""Synthetic images with known flat regions, and the bundled sample photos."""

from __future__ import annotations

import sys

import pytest
import torch

from vitreg.errors import InputError, VitregError
from vitreg.testing import make_synthetic, synthetic_images, synthetic_pil
from vitreg.testing.planted import FlatRule

IMAGENET = (torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225]))


def test_shape_range_and_determinism() -> None:
    a = synthetic_images(3, 64, seed=5)
    assert a.shape == (3, 3, 64, 64) and a.dtype == torch.float32
    assert a.min() >= 0 and a.max() <= 1
    assert torch.equal(a, synthetic_images(3, 64, seed=5))
    assert not torch.equal(a, synthetic_images(3, 64, seed=6))
    assert not torch.equal(a[0], a[1])  # images of one batch differ


@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5])
def test_flat_masks_cover_the_requested_fraction(fraction: float) -> None:
    s = make_synthetic(4, 96, seed=1, flat_fraction=fraction)
    assert s.flat_masks.shape == (4, 96, 96) and s.flat_masks.dtype == torch.bool
    assert torch.allclose(
        s.flat_masks.float().mean(dim=(1, 2)), torch.full((4,), fraction), atol=0.01
    )


def test_flat_regions_are_flat_and_the_rest_textured() -> None:
    s = make_synthetic(8, 112, seed=2)
    mean, std = IMAGENET
    x = (s.images - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    rule = FlatRule(patch_size=14, threshold=0.05, n_filters=16, filter_seed=0)
    energy = rule.texture_energy(x) / rule.threshold
    cover = s.patch_coverage(14)
    assert (cover == 1).sum() > 20 and (cover == 0).sum() > 200
    assert energy[cover == 1].max() < 0.3  # fully flat patches: far below the threshold
    assert energy[cover == 0].min() > 2.0  # fully textured patches: far above it
    inside = s.flat_masks[:, None].expand_as(x)
    colour_std = x[inside].std()
    assert colour_std > 0.1  # flat regions have colour, just no texture


def test_pil_variant_and_bad_arguments() -> None:
    ims = synthetic_pil(2, 48, seed=0)
    assert len(ims) == 2 and ims[0].size == (48, 48) and ims[0].mode == "RGB"
    with pytest.raises(InputError):
        synthetic_images(0, 64)
    with pytest.raises(InputError):
        synthetic_images(1, 64, flat_fraction=1.5)


def test_sample_images_are_rgb_photos() -> None:
    pytest.importorskip("skimage")
    from vitreg.data.samples import SAMPLES, sample_images

    photos = sample_images()
    assert [n for n, _ in photos] == list(SAMPLES)
    assert all(im.mode == "RGB" and min(im.size) >= 256 for _, im in photos)
    ((name, one),) = sample_images(["camera"])  # greyscale source, converted
    assert name == "camera" and one.mode == "RGB"
    with pytest.raises(InputError, match="astronaut"):
        sample_images(["nope"])


def test_sample_images_without_scikit_image(monkeypatch) -> None:
    from vitreg.data.samples import sample_images

    monkeypatch.setitem(sys.modules, "skimage", None)
    with pytest.raises(VitregError, match=r"pip install vitreg\[samples\]"):
        sample_images()
