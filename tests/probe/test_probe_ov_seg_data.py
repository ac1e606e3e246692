"""The protocol's extra layouts on tiny synthetic copies: voc20 drops background, cityscapes
reads train-id masks by city, and both name their classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vitreg.data.datasets import IGNORE_INDEX, open_dataset
from vitreg.probe.ov_seg_data import CITYSCAPES_CLASSES


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
