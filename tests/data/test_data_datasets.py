"""Dataset specs and readers on tiny hand-made trees: splits, class maps, counted bad input."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitreg.data.datasets import (
    IGNORE_INDEX,
    LabeledDataset,
    SkipSample,
    iter_samples,
    open_dataset,
)
from vitreg.data.formats import ADE20K_CLASSES, VOC_CLASSES, voc_palette
from vitreg.errors import InputError, SpecError


def rgb(path: Path, w: int = 24, h: int = 16, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return path


def png(path: Path, arr: np.ndarray, mode: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(arr)
    if mode == "P":  # palette PNG as VOC ships it: pixel values are the class ids
        img.putpalette([v for i in range(256) for v in (i, 255 - i, i // 2)])
        assert img.mode == "P"
    img.save(path)
    return path


def corrupt(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    return path


def used(ds: LabeledDataset) -> dict:
    return {s.key: s for _, s in iter_samples(ds)}


# ------------------------------------------------------------------ specs
def test_spec_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="known:.*imagefolder.*synthetic-seg.*voc"):
        open_dataset("coco:/x")
    with pytest.raises(SpecError, match="voc:DIR"):
        open_dataset("voc")
    with pytest.raises(SpecError, match="split"):
        open_dataset("synthetic:n=2", "test")
    with pytest.raises(SpecError, match="keys"):
        open_dataset("synthetic-seg:count=3")
    with pytest.raises(SpecError, match="integer"):
        open_dataset("synthetic-seg:n=many")
    with pytest.raises(InputError, match="does not exist"):
        open_dataset(f"imagefolder:{tmp_path / 'missing'}")
    with pytest.raises(InputError, match="empty"):
        open_dataset(f"imagefolder:{tmp_path}")
    (tmp_path / "cls").mkdir()
    (tmp_path / "cls" / "notes.txt").write_text("x")
    with pytest.raises(InputError, match="no images in class subfolders"):
        open_dataset(f"imagefolder:{tmp_path}")


# ------------------------------------------------------------------ imagefolder
def test_imagefolder_seeded_split_labels_and_bad_files(tmp_path: Path) -> None:
    for c in ("cat", "dog"):
        for i in range(5):
            rgb(tmp_path / c / f"{c}{i}.png", seed=i)
    corrupt(tmp_path / "dog" / "broken.jpg")
    (tmp_path / "README.txt").write_text("notes")
    rgb(tmp_path / "loose.png")
    train = open_dataset(f"imagefolder:{tmp_path}", "train")
    val = open_dataset(f"imagefolder:{tmp_path}", "val")
    assert isinstance(train, LabeledDataset) and train.targets == ("label",)
    assert train.class_names == val.class_names == ["cat", "dog"] and train.num_classes == 2
    keys_tr = {it.key for it in train.items}
    keys_va = {it.key for it in val.items}
    assert not keys_tr & keys_va and len(keys_tr | keys_va) == 11  # 10 good + broken
    assert sorted(it.label for it in val.items) == [0, 1]  # stratified: one val image per class
    assert keys_tr == {it.key for it in open_dataset(f"imagefolder:{tmp_path}").items}  # seeded
    for ds in (train, val):
        for key, s in used(ds).items():
            assert s.image.mode == "RGB" and s.label == ds.class_names.index(key.split("/")[0])
    logs = {**train.log.to_dict(), **val.log.to_dict()}
    assert logs["unreadable_image"] == 1
    assert logs["not_an_image_file"] == 1 and logs["image_outside_class_folder"] == 1
    bad = next(i for i, it in enumerate(train.items + val.items) if "broken" in it.key)
    ds = train if bad < len(train) else val
    for _ in range(2):  # a second read does not count again
        with pytest.raises(SkipSample, match="unreadable_image"):
            ds[bad % len(train)]
    assert ds.log.to_dict()["unreadable_image"] == 1


def test_imagefolder_presplit_classes_are_the_union(tmp_path: Path) -> None:
    rgb(tmp_path / "train" / "a" / "1.png")
    rgb(tmp_path / "train" / "b" / "1.png")
    rgb(tmp_path / "val" / "c" / "1.png")
    val = open_dataset(f"imagefolder:{tmp_path}", "val")
    assert val.class_names == ["a", "b", "c"]
    assert [(s.key, s.label) for s in used(val).values()] == [("val/c/1.png", 2)]
    assert len(open_dataset(f"imagefolder:{tmp_path}", "train")) == 2


def test_fingerprint_follows_file_content(tmp_path: Path) -> None:
    path = rgb(tmp_path / "a" / "1.png")
    before = open_dataset(f"imagefolder:{tmp_path}").describe()
    assert before["n"] == 1 and before["split"] == "train"
    rgb(path, w=30, seed=3)
    os.utime(path, ns=(0, 10**18))
    after = open_dataset(f"imagefolder:{tmp_path}").describe()
    assert after["fingerprint"] != before["fingerprint"]


# ------------------------------------------------------------------ VOC
@pytest.fixture
def voc(tmp_path: Path) -> Path:
    root = tmp_path / "VOCdevkit" / "VOC2012"
    for k in "abcdef":
        rgb(root / "JPEGImages" / f"{k}.jpg", w=24, h=16)
    corrupt(root / "JPEGImages" / "f.jpg")
    seg = root / "SegmentationClass"
    ids = np.zeros((16, 24), np.uint8)
    ids[:, 8:] = 15
    ids[0, :] = 255  # boundary: stays ignore
    ids[5, :3] = 30  # unknown: 3 pixels -> ignore
    png(seg / "a.png", ids, mode="P")
    png(seg / "b.png", np.zeros((10, 10), np.uint8), mode="P")  # size mismatch
    # c: no mask
    colours = {cid: code for code, cid in voc_palette().items()}
    col = np.zeros((16, 24, 3), np.uint8)
    for cid, sl in ((7, np.s_[:, :12]), (255, np.s_[:2, :])):
        code = colours[cid]
        col[sl] = [(code >> 16) & 255, (code >> 8) & 255, code & 255]
    col[15, 23] = [1, 2, 3]  # a colour no class has
    png(seg / "d.png", col)  # RGB-saved mask
    png(seg / "e.png", np.ones((16, 24), np.uint8), mode="P")
    png(seg / "f.png", np.ones((16, 24), np.uint8), mode="P")
    sets = root / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    (sets / "train.txt").write_text("a\nb\nc\nd\nf\n")
    (sets / "val.txt").write_text("e\n")
    return tmp_path


def test_voc_masks_ignore_and_bad_pairs(voc: Path) -> None:
    train = open_dataset(f"voc:{voc}", "train")
    assert train.num_classes == 21 and train.class_names == VOC_CLASSES and len(train) == 5
    got = used(train)
    assert sorted(got) == ["a", "d"]
    a = got["a"].mask
    assert a.dtype == np.int64 and a.shape == (16, 24)
    assert (a[0] == IGNORE_INDEX).all() and (a[5, :3] == IGNORE_INDEX).all()
    assert (a[1:, 8:] == 15).all() and a[6, 0] == 0
    d = got["d"].mask
    assert (d[2:, :12] == 7).all() and (d[:2] == IGNORE_INDEX).all() and d[15, 23] == IGNORE_INDEX
    assert (d[2:15, 12:] == 0).all()
    assert train.log.to_dict() == {
        "mask_size_mismatch": 1,
        "missing_mask": 1,
        "unknown_class_pixels": 4,
        "unreadable_image": 1,
    }
    assert train.log.examples["missing_mask"] == ["c"]
    val = open_dataset(f"voc:{voc / 'VOCdevkit'}", "val")
    assert [s.key for s in used(val).values()] == ["e"] and not val.log.to_dict()


def test_voc_boxes_from_xml(voc: Path) -> None:
    root = voc / "VOCdevkit" / "VOC2012"
    ann = root / "Annotations"
    ann.mkdir()
    obj = "<object><name>{n}</name><bndbox><xmin>{}</xmin><ymin>{}</ymin><xmax>{}</xmax><ymax>{}</ymax></bndbox></object>"
    xml = "<annotation><size><width>{w}</width><height>16</height></size>{objs}</annotation>"
    objs = obj.format(1, 2, 10, 8, n="cat") + obj.format(5, 5, 30, 16, n="dog")
    (ann / "a.xml").write_text(xml.format(w=24, objs=objs))
    (ann / "b.xml").write_text(xml.format(w=99, objs=obj.format(3, 3, 4, 4, n="x")))
    (ann / "c.xml").write_text("<annotation><object>")
    (ann / "d.xml").write_text(xml.format(w=24, objs=""))
    main = root / "ImageSets" / "Main"
    main.mkdir(parents=True)
    (main / "train.txt").write_text("a\nb\nc\nd\n")
    ds = open_dataset(f"voc-boxes:{root}", "train")
    assert ds.targets == ("boxes",)
    got = used(ds)
    assert sorted(got) == ["a", "b"] and got["a"].mask is None
    np.testing.assert_array_equal(got["a"].boxes, [[0, 1, 10, 8], [4, 4, 24, 16]])
    np.testing.assert_array_equal(got["b"].boxes, [[2, 2, 4, 4]])
    assert ds.log.to_dict() == {
        "annotation_size_mismatch": 1,
        "boxes_clipped": 1,
        "no_boxes": 1,
        "unreadable_annotation": 1,
    }


# ------------------------------------------------------------------ ADE20k
def test_ade20k_label_shift_and_unknown_ids(tmp_path: Path) -> None:
    root = tmp_path / "ADEChallengeData2016"
    rgb(root / "images" / "training" / "x.jpg", w=20, h=10)
    raw = np.zeros((10, 20), np.uint8)
    raw[:, 5:] = 1
    raw[:, 10:] = 150
    raw[0, 15:] = 151
    raw[1, 15:] = 200
    png(root / "annotations" / "training" / "x.png", raw)
    rgb(root / "images" / "validation" / "y.jpg")
    (root / "images" / "validation" / "Thumbs.db").write_bytes(b"x")
    assert len(ADE20K_CLASSES) == 150 == len(set(ADE20K_CLASSES))
    train = open_dataset(f"ade20k:{tmp_path}", "train")
    mask = train[0].mask
    assert (mask[:, :5] == IGNORE_INDEX).all() and (mask[:, 5:10] == 0).all()
    assert (mask[2:, 10:] == 149).all() and (mask[:2, 15:] == IGNORE_INDEX).all()
    assert train.num_classes == 150 and train.log.to_dict() == {"unknown_class_pixels": 10}
    val = open_dataset(f"ade20k:{root}", "val")
    assert not used(val)
    assert val.log.to_dict() == {"missing_mask": 1, "not_an_image_file": 1}
    with pytest.raises(InputError, match="ADEChallengeData2016"):
        open_dataset(f"ade20k:{tmp_path / 'nothing'}")


# ------------------------------------------------------------------ NYU
def test_nyu_depth_units_and_invalid_pixels(tmp_path: Path) -> None:
    for k in "abcde":
        rgb(tmp_path / "train" / "rgb" / f"{k}.jpg", w=8, h=6)
    corrupt(tmp_path / "train" / "rgb" / "e.jpg")
    mm = np.full((6, 8), 1500, np.uint16)
    mm[0, :4] = 0
    png(tmp_path / "train" / "depth" / "a.png", mm)
    m = np.full((6, 8), 2.25, np.float32)
    m[1, 1], m[2, 2], m[3, 3] = np.nan, -1.0, np.inf
    np.save(tmp_path / "train" / "depth" / "b.npy", m)
    np.save(tmp_path / "train" / "depth" / "d.npy", np.ones((5, 8), np.float32))
    np.save(tmp_path / "train" / "depth" / "e.npy", np.ones((6, 8), np.float32))
    ds = open_dataset(f"nyu:{tmp_path}")
    got = used(ds)
    assert sorted(got) == ["a", "b"] and ds.targets == ("depth",)
    a, b = got["a"].depth, got["b"].depth
    assert a.dtype == np.float32 and np.isnan(a[0, :4]).all() and np.allclose(a[1:], 1.5)
    assert np.isnan(b).sum() == 3 and np.allclose(b[0], 2.25)
    assert ds.log.to_dict() == {
        "depth_size_mismatch": 1,
        "invalid_depth_pixels": 7,
        "missing_depth": 1,
        "unreadable_image": 1,
    }
    with pytest.raises(InputError, match="rgb"):
        open_dataset(f"nyu:{tmp_path}", "val")
    (tmp_path / "val" / "rgb").mkdir(parents=True)
    with pytest.raises(InputError, match="empty"):
        open_dataset(f"nyu:{tmp_path}", "val")
