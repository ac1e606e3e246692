"""Synthetic shapes agree with themselves; prepare() moves images and targets together."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from vitreg.data.datasets import Sample, open_dataset
from vitreg.data.synthetic import CLASS_NAMES, render
from vitreg.data.transforms import Prepared, crop_geometry, model_input, prepare
from vitreg.errors import SpecError
from vitreg.models.wrapping import wrap


def test_items_are_deterministic_lazy_and_split_apart() -> None:
    ds = open_dataset("synthetic:n=6,size=32,seed=3", "train")
    late = ds[5]
    first = [ds[i] for i in range(6)]
    again = open_dataset("synthetic:n=6,size=32,seed=3", "train")
    for i in range(6):
        a, b = first[i], again[i]
        assert a.key == f"synthetic/{i:06d}" and a.image.size == (32, 32)
        assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
        assert np.array_equal(a.mask, b.mask) and np.array_equal(a.boxes, b.boxes)
    assert np.array_equal(np.asarray(late.image), np.asarray(first[5].image))
    val = open_dataset("synthetic:n=6,size=32,seed=3", "val")
    other = open_dataset("synthetic:n=6,size=32,seed=4", "train")
    for i in range(6):
        img = np.asarray(first[i].image)
        assert not np.array_equal(img, np.asarray(val[i].image))
        assert not np.array_equal(img, np.asarray(other[i].image))
    assert ds.describe()["fingerprint"] == again.describe()["fingerprint"]
    assert ds.describe()["fingerprint"] != val.describe()["fingerprint"]
    with pytest.raises(IndexError):
        ds[6]


def test_masks_depth_boxes_and_label_agree() -> None:
    n_shapes, labels = [], []
    for i in range(40):
        sc = render(0, "train", i, size=48)
        k = len(sc.classes)
        n_shapes.append(k)
        assert 1 <= k <= 3 and set(np.unique(sc.instances)) == set(range(k + 1))
        fg = sc.instances > 0
        assert (sc.mask[~fg] == 0).all()
        assert (sc.mask[fg] == sc.classes[sc.instances[fg] - 1]).all()
        assert np.isfinite(sc.depth).all() and (sc.depth > 0).all()
        assert np.all(sc.depth[~fg] > sc.shape_depths.max())  # shapes stand before the plane
        areas = [(sc.instances == j + 1).sum() for j in range(k)]
        for j in range(k):
            rows, cols = np.nonzero(sc.instances == j + 1)
            assert np.allclose(sc.depth[rows, cols], sc.shape_depths[j])
            x0, y0, x1, y1 = sc.boxes[j]
            assert (x0, y0, x1, y1) == (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1)
        # shapes are listed (and painted) far to near, so nearer ones occlude farther ones
        assert (np.diff(sc.shape_depths) < 0).all()
        assert sc.label == sc.classes[int(np.argmax(areas))]
        labels.append(sc.label)
    assert set(n_shapes) == {1, 2, 3} and set(labels) == {1, 2, 3}


def test_variants_fill_only_their_targets() -> None:
    wanted = {
        "synthetic-seg": "mask",
        "synthetic-depth": "depth",
        "synthetic-boxes": "boxes",
        "synthetic-cls": "label",
    }
    for name, target in wanted.items():
        ds = open_dataset(f"{name}:n=2,size=16")
        s = ds[0]
        assert ds.targets == (target,) and ds.class_names == CLASS_NAMES
        filled = {t for t in ("label", "mask", "depth", "boxes") if getattr(s, t) is not None}
        assert filled == {target}
    full = open_dataset("synthetic")
    assert len(full) == 200 and full.num_classes == 4 and full[0].image.size == (64, 64)
    with pytest.raises(SpecError, match="16 <= size <= 4096"):
        open_dataset("synthetic:size=8")


def test_prepare_geometry_on_a_hand_made_case() -> None:
    w, h = 16, 8  # short side 8 -> 4: resized 8x4, centre crop starts at x=2
    assert crop_geometry(w, h, 4) == (8, 4, 2, 0)
    assert crop_geometry(8, 16, 4) == (4, 8, 0, 2)
    cols = np.broadcast_to(np.arange(w), (h, w))
    depth = cols.astype(np.float32) + 1
    depth[:, 9] = np.nan
    boxes = np.array([[4, 0, 12, 8], [0, 0, 3, 4], [14, 2, 16, 6], [10, 2, 13, 4]], np.float32)
    img = Image.new("RGB", (w, h), (255, 0, 51))
    sample = Sample(img, "k", label=2, mask=cols.astype(np.int64), depth=depth, boxes=boxes)
    out = prepare(sample, 4, mean=(0.5, 0.5, 0.2), std=(0.5, 0.5, 0.5))
    assert out["key"] == "k" and out["label"].item() == 2 and out["label"].dtype == torch.int64
    x = out["image"]
    assert x.shape == (3, 4, 4)
    assert torch.allclose(x[0], torch.ones(4, 4)) and torch.allclose(x[1], -torch.ones(4, 4))
    assert torch.allclose(x[2], torch.zeros(4, 4), atol=1e-6)
    # nearest downscale by 2 samples source columns 1, 3, 5, ...; the crop keeps resized 2..5
    assert out["mask"].dtype == torch.int64 and out["mask"][0].tolist() == [5, 7, 9, 11]
    assert (out["mask"] == out["mask"][0]).all()
    d = out["depth"]
    assert d.dtype == torch.float32 and torch.isnan(d[:, 2]).all()
    assert d[0, [0, 1, 3]].tolist() == [6.0, 8.0, 12.0]
    # scaled by 1/2, shifted by -2, clipped to [0, 4]; the box left of the crop is dropped
    assert out["boxes"].tolist() == [[0, 0, 4, 4], [3, 1, 4, 2]]
    # every key is one that Prepared names; a sample without targets gives the required ones only
    assert list(out) == list(Prepared.__annotations__)
    bare = prepare(Sample(img, "b"), 4, mean=(0.5, 0.5, 0.2), std=(0.5, 0.5, 0.5))
    assert set(bare) == Prepared.__required_keys__ == {"key", "image"}


def test_model_input_reads_the_models_data_config() -> None:
    module = timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=1, img_size=32)
    size, mean, std = model_input(wrap(module.eval()))
    assert size == 32
    assert mean == pytest.approx((0.485, 0.456, 0.406)) and std == pytest.approx(
        (0.229, 0.224, 0.225)
    )


def test_hue_paints_each_class_in_its_own_colour_on_the_same_scene() -> None:
    plain, hued = render(0, "train", 3, 48), render(0, "train", 3, 48, hue=1)
    assert np.array_equal(plain.mask, hued.mask) and plain.label == hued.label
    means = {}
    for seed in range(4):
        for i in range(8):
            scene = render(seed, "val", i, 48, hue=1)
            for c in np.unique(scene.mask[scene.mask > 0]):
                means.setdefault(int(c), []).append(scene.image[scene.mask == c].mean(0))
    dominant = {c: int(np.argmax(np.mean(v, 0))) for c, v in means.items()}
    assert dominant == {1: 0, 2: 1, 3: 2}  # square red, disc green, triangle blue
    one = open_dataset("synthetic-cls:n=4,hue=1", "train")
    assert one.describe()["params"]["hue"] == 1
    other = open_dataset("synthetic-cls:n=4", "train")
    assert one.fingerprint() != other.fingerprint()
    with pytest.raises(SpecError, match="hue 0 or 1"):
        open_dataset("synthetic-cls:hue=2", "train")
