"""Readers for the open-vocabulary segmentation protocol's layouts beyond ``voc:`` (VOC21) and
``ade20k:``: ``voc20:DIR`` (VOC2012 without background: 0 and 255 ignored, 1..20 -> 0..19, as
SCLIP's ``PascalVOC20Dataset`` with ``reduce_zero_label``) and ``cityscapes:DIR`` (mmseg's
layout: ``leftImg8bit/{train,val}/<city>/*_leftImg8bit.png`` with
``gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png``, 19 train ids, 255 ignored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitreg.data.datasets import IGNORE_INDEX, Sample, register_dataset
from vitreg.data.formats import VOC_CLASSES, FileDataset, FileItem, VOCSegmentation
from vitreg.errors import InputError, SpecError

CITYSCAPES_CLASSES = [
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train",
    "motorcycle", "bicycle",
]  # fmt: skip
IMAGE_SUFFIX = "_leftImg8bit.png"
MASK_SUFFIX = "_gtFine_labelTrainIds.png"


class VOC20(VOCSegmentation):
    """VOC2012 ``SegmentationClass`` masks without the background class."""

    def __init__(self, spec: str, split: str, root: Path) -> None:
        super().__init__(spec, split, root)
        self.name = "voc20"
        self.class_names = list(VOC_CLASSES[1:])
        self.num_classes = len(self.class_names)

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        image = self.read_image(item)
        ids = self.read_ids(item, image, self._palette)
        bad = (ids > len(VOC_CLASSES) - 1) & (ids != IGNORE_INDEX)
        ids = self.unknown_to_ignore(ids, bad, item.key)
        shifted = np.where((ids == 0) | (ids == IGNORE_INDEX), IGNORE_INDEX, ids - 1)
        return Sample(image, item.key, mask=shifted.astype(np.int64))


class Cityscapes(FileDataset):
    """Cityscapes fine annotations as train ids (mmseg's converted ``labelTrainIds``)."""

    def __init__(self, spec: str, split: str, root: Path) -> None:
        super().__init__("cityscapes", spec, split, ("mask",))
        folder = root / "leftImg8bit" / split
        if not folder.is_dir():
            raise InputError(
                f"no leftImg8bit/{split}/ in {root}; cityscapes:DIR expects leftImg8bit/"
                "{train,val}/<city>/*_leftImg8bit.png and gtFine/{train,val}/<city>/"
                "*_gtFine_labelTrainIds.png (mmseg's tools/dataset_converters/cityscapes.py)"
            )
        masks = root / "gtFine" / split
        for image in sorted(p for p in self.images_in(folder) if p.name.endswith(IMAGE_SUFFIX)):
            key = image.name.removesuffix(IMAGE_SUFFIX)
            target = masks / image.parent.name / f"{key}{MASK_SUFFIX}"
            self.items.append(FileItem(key, image, target if target.is_file() else None))
        if not self.items:
            raise InputError(f"no *{IMAGE_SUFFIX} images under {folder}")
        self.class_names = list(CITYSCAPES_CLASSES)
        self.num_classes = len(CITYSCAPES_CLASSES)

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        image = self.read_image(item)
        ids = self.read_ids(item, image, None)
        bad = (ids >= self.num_classes) & (ids != IGNORE_INDEX)
        return Sample(image, item.key, mask=self.unknown_to_ignore(ids, bad, item.key))


def _builder(cls: type) -> Any:
    def build(name: str, arg: str, split: str, spec: str) -> Any:
        if not arg:
            raise SpecError(f"{name} needs a directory: {name}:DIR")
        return cls(spec, split, Path(arg).expanduser())

    return build


register_dataset("voc20")(_builder(VOC20))
register_dataset("cityscapes")(_builder(Cityscapes))
