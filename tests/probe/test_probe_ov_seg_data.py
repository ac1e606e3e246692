"""The protocol's extra layouts on tiny synthetic copies: voc20 drops background, cityscapes
reads train-id masks by city, Pascal Context keeps (60) or drops (59) background, COCO-Stuff
reads 171 train ids and COCO-Object its converted ids (or converts COCO-Stuff's); all name
their classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitreg.data.datasets import IGNORE_INDEX, open_dataset
from vitreg.errors import InputError
from vitreg.probe.ov_seg_data import CITYSCAPES_CLASSES, COCO_OBJECT_CLASSES, CONTEXT60_CLASSES


def _save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_voc20_shifts_classes_and_ignores_background(tmp_path: Path) -> None:
    root = tmp_path / "VOCdevkit" / "VOC2012"
    mask = np.array([[0, 1, 20, 255]] * 4, dtype=np.uint8)
    for key in ("a", "b"):
        _save(root / "JPEGImages" / f"{key}.jpg", np.zeros((4, 4, 3), np.uint8))
        _save(root / "SegmentationClass" / f"{key}.png", mask)
    (root / "ImageSets" / "Segmentation").mkdir(parents=True)
    (root / "ImageSets" / "Segmentation" / "val.txt").write_text("b\n")
    ds = open_dataset(f"voc20:{tmp_path}", "val")
    assert len(ds) == 1 and ds.class_names[0] == "aeroplane" and len(ds.class_names) == 20
    got = ds[0].mask
    assert got[0].tolist() == [IGNORE_INDEX, 0, 19, IGNORE_INDEX]


def test_cityscapes_reads_train_ids_per_city(tmp_path: Path) -> None:
    for city, key in (("aachen", "aachen_000000_000019"), ("bremen", "bremen_000001_000019")):
        _save(tmp_path / "leftImg8bit" / "val" / city / f"{key}_leftImg8bit.png",
              np.zeros((4, 6, 3), np.uint8))  # fmt: skip
        ids = np.array([[0, 18, 19, 255, 7, 7]] * 4, dtype=np.uint8)
        _save(tmp_path / "gtFine" / "val" / city / f"{key}_gtFine_labelTrainIds.png", ids)
    ds = open_dataset(f"cityscapes:{tmp_path}", "val")
    assert len(ds) == 2 and ds.class_names == CITYSCAPES_CLASSES
    sample = ds[1]
    assert sample.key == "bremen_000001_000019"
    assert sample.mask[0].tolist() == [0, 18, IGNORE_INDEX, IGNORE_INDEX, 7, 7]  # 19: unknown


def _context(root: Path, keys: tuple[str, ...], mask: np.ndarray, listed: str) -> None:
    voc = root / "VOCdevkit" / "VOC2010"
    for key in keys:
        _save(voc / "JPEGImages" / f"{key}.jpg", np.zeros(mask.shape + (3,), np.uint8))
        _save(voc / "SegmentationClassContext" / f"{key}.png", mask)
    (voc / "ImageSets" / "SegmentationContext").mkdir(parents=True)
    (voc / "ImageSets" / "SegmentationContext" / "val.txt").write_text(listed)


def test_pascal_context_keeps_or_drops_background(tmp_path: Path) -> None:
    mask = np.array([[0, 1, 59, 60, 255]] * 3, dtype=np.uint8)  # 60: no such class
    _context(tmp_path, ("2008_000001", "2008_000002"), mask, "2008_000002\n")
    c60 = open_dataset(f"context60:{tmp_path}", "val")
    assert len(c60) == 1 and c60.items[0].key == "2008_000002"
    assert c60.class_names == CONTEXT60_CLASSES and c60.num_classes == 60
    assert c60[0].mask[0].tolist() == [0, 1, 59, IGNORE_INDEX, IGNORE_INDEX]
    c59 = open_dataset(f"context59:{tmp_path / 'VOCdevkit'}", "val")  # VOC2010 found below
    assert c59.class_names == CONTEXT60_CLASSES[1:] and c59.num_classes == 59
    assert c59[0].mask[0].tolist() == [IGNORE_INDEX, 0, 58, IGNORE_INDEX, IGNORE_INDEX]


def _coco(root: Path, key: str, suffix: str, ids: np.ndarray) -> None:
    _save(root / "images" / "val2017" / f"{key}.jpg", np.zeros(ids.shape + (3,), np.uint8))
    _save(root / "annotations" / "val2017" / f"{key}{suffix}", ids)


def test_coco_stuff_reads_171_train_ids(tmp_path: Path) -> None:
    _coco(
        tmp_path,
        "000000000139",
        "_labelTrainIds.png",
        np.array([[0, 79, 80, 170, 171, 255]], np.uint8),
    )
    ds = open_dataset(f"coco-stuff:{tmp_path}", "val")
    assert ds.num_classes == 171 and ds.class_names[:2] == ["person", "bicycle"]
    assert ds.class_names[80] == "banner" and ds.class_names[-1] == "wood"
    assert ds[0].mask[0].tolist() == [0, 79, 80, 170, IGNORE_INDEX, IGNORE_INDEX]


def test_coco_object_reads_instance_ids_or_converts_stuff_ids(tmp_path: Path) -> None:
    _coco(tmp_path, "a", "_instanceTrainIds.png", np.array([[0, 1, 80, 81, 255]], np.uint8))
    _coco(tmp_path, "b", "_labelTrainIds.png", np.array([[0, 79, 80, 170, 255]], np.uint8))
    ds = open_dataset(f"coco-object:{tmp_path}", "val")
    assert ds.class_names == COCO_OBJECT_CLASSES and ds.num_classes == 81
    assert ds[0].mask[0].tolist() == [0, 1, 80, IGNORE_INDEX, IGNORE_INDEX]  # 81: no class
    # the COCO-Object conversion of COCO-Stuff ids: things + 1, stuff and unlabelled -> 0
    assert ds[1].mask[0].tolist() == [1, 80, 0, 0, 0]


def test_missing_layouts_say_what_they_expect(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="SegmentationClassContext"):
        open_dataset(f"context60:{tmp_path}", "val")
    with pytest.raises(InputError, match="_instanceTrainIds"):
        open_dataset(f"coco-object:{tmp_path}", "val")
