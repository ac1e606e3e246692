"""Readers for the open-vocabulary segmentation protocol's layouts beyond ``voc:`` (VOC21) and
``ade20k:``, each as mmseg prepares it and SCLIP's configs (``wangf3014/SCLIP`` @ ``b56bd30``,
``configs/cfg_*.py``, reused by NACLIP) read it:

- ``voc20:DIR``: VOC2012 without background (0 and 255 ignored, 1..20 -> 0..19, SCLIP's
  ``PascalVOC20Dataset`` with ``reduce_zero_label``);
- ``cityscapes:DIR``: ``leftImg8bit/{train,val}/<city>/*_leftImg8bit.png`` with
  ``gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png`` (19 train ids, 255 ignored);
- ``context60:DIR`` / ``context59:DIR``: Pascal Context, ``VOCdevkit/VOC2010/JPEGImages`` with
  ``SegmentationClassContext/*.png`` (0 = background, 1..59 = classes; mmseg's
  ``pascal_context.py`` converter) listed by ``ImageSets/SegmentationContext/{train,val}.txt``;
  context60 keeps the background class, context59 ignores it and shifts 1..59 -> 0..58
  (``reduce_zero_label``);
- ``coco-object:DIR``: ``images/{train,val}2017/*.jpg`` with
  ``annotations/{train,val}2017/*_instanceTrainIds.png`` (0 = background, 1..80 = the COCO
  things; SCLIP's ``datasets/cvt_coco_object.py``); without those files the COCO-Stuff
  ``*_labelTrainIds.png`` are converted the same way on reading (things 0..79 -> 1..80, stuff
  and unlabelled -> background);
- ``coco-stuff:DIR``: COCO-Stuff 164k, ``images/{train,val}2017/*.jpg`` with
  ``annotations/{train,val}2017/*_labelTrainIds.png`` (171 train ids, 255 ignored; mmseg's
  ``coco_stuff164k.py`` converter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitreg.data.datasets import IGNORE_INDEX, Sample, register_dataset
from vitreg.data.formats import (
    IMAGE_ORDER,
    VOC_CLASSES,
    FileDataset,
    FileItem,
    VOCSegmentation,
    by_stem_files,
    layout_root,
    voc_ids,
)
from vitreg.errors import InputError, SpecError

CITYSCAPES_CLASSES = [
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train",
    "motorcycle", "bicycle",
]  # fmt: skip
CONTEXT60_CLASSES = [
    "background", "aeroplane", "bag", "bed", "bedclothes", "bench", "bicycle", "bird", "boat",
    "book", "bottle", "building", "bus", "cabinet", "car", "cat", "ceiling", "chair", "cloth",
    "computer", "cow", "cup", "curtain", "dog", "door", "fence", "floor", "flower", "food",
    "grass", "ground", "horse", "keyboard", "light", "motorbike", "mountain", "mouse", "person",
    "plate", "platform", "pottedplant", "road", "rock", "sheep", "shelves", "sidewalk", "sign",
    "sky", "snow", "sofa", "table", "track", "train", "tree", "truck", "tvmonitor", "wall",
    "water", "window", "wood",
]  # fmt: skip
COCO_OBJECT_CLASSES = [
    "background", "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck",
    "boat", "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird",
    "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack",
    "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball",
    "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket",
    "bottle", "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple",
    "sandwich", "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair",
    "couch", "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote",
    "keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
]  # fmt: skip
COCO_STUFF_CLASSES = COCO_OBJECT_CLASSES[1:] + [
    "banner", "blanket", "branch", "bridge", "building-other", "bush", "cabinet", "cage",
    "cardboard", "carpet", "ceiling-other", "ceiling-tile", "cloth", "clothes", "clouds",
    "counter", "cupboard", "curtain", "desk-stuff", "dirt", "door-stuff", "fence",
    "floor-marble", "floor-other", "floor-stone", "floor-tile", "floor-wood", "flower", "fog",
    "food-other", "fruit", "furniture-other", "grass", "gravel", "ground-other", "hill",
    "house", "leaves", "light", "mat", "metal", "mirror-stuff", "moss", "mountain", "mud",
    "napkin", "net", "paper", "pavement", "pillow", "plant-other", "plastic", "platform",
    "playingfield", "railing", "railroad", "river", "road", "rock", "roof", "rug", "salad",
    "sand", "sea", "shelf", "sky-other", "skyscraper", "snow", "solid-other", "stairs", "stone",
    "straw", "structural-other", "table", "tent", "textile-other", "towel", "tree", "vegetable",
    "wall-brick", "wall-concrete", "wall-other", "wall-panel", "wall-stone", "wall-tile",
    "wall-wood", "water-other", "waterdrops", "window-blind", "window-other", "wood",
]  # fmt: skip
COCO_THINGS = 80  # train ids 0..79 of COCO-Stuff are the things, 80..170 the stuff
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


class PascalContext(FileDataset):
    """Pascal Context (VOC2010) masks with 60 classes (``context60``, background kept) or 59
    (``context59``, background ignored)."""

    def __init__(self, name: str, spec: str, split: str, root: Path) -> None:
        super().__init__(name, spec, split, ("mask",))
        root = layout_root(
            root,
            ("VOC2010", "VOCdevkit/VOC2010"),
            "SegmentationClassContext",
            f"{name}:DIR expects mmseg's Pascal Context layout: "
            "VOCdevkit/VOC2010/{JPEGImages,SegmentationClassContext}/ and "
            "ImageSets/SegmentationContext/{train,val}.txt",
        )
        masks = root / "SegmentationClassContext"
        ids = voc_ids(root, "SegmentationContext", masks, ".png", split)
        images = by_stem_files(root / "JPEGImages", IMAGE_ORDER)
        by_stem = by_stem_files(masks, (".png",))
        self.items = [
            FileItem(k, images.get(k, root / "JPEGImages" / k), by_stem.get(k)) for k in ids
        ]
        self.background = name == "context60"
        self.class_names = list(CONTEXT60_CLASSES if self.background else CONTEXT60_CLASSES[1:])
        self.num_classes = len(self.class_names)

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        image = self.read_image(item)
        ids = self.read_ids(item, image, None)
        bad = (ids >= len(CONTEXT60_CLASSES)) & (ids != IGNORE_INDEX)
        ids = self.unknown_to_ignore(ids, bad, item.key)
        if not self.background:
            ids = np.where((ids == 0) | (ids == IGNORE_INDEX), IGNORE_INDEX, ids - 1)
        return Sample(image, item.key, mask=ids.astype(np.int64))


class COCOSegmentation(FileDataset):
    """COCO 2017 images with train-id masks: ``coco-stuff`` (171 classes) or ``coco-object``
    (background + 80 things)."""

    SUFFIXES = {"coco-stuff": ("_labelTrainIds.png",), "coco-object": ("_instanceTrainIds.png",
                "_labelTrainIds.png")}  # fmt: skip

    def __init__(self, name: str, spec: str, split: str, root: Path) -> None:
        super().__init__(name, spec, split, ("mask",))
        sub = f"{split}2017"
        root = layout_root(
            root,
            ("coco_stuff164k", "coco_object"),
            f"images/{sub}",
            f"{name}:DIR expects images/{{train,val}}2017/*.jpg and "
            f"annotations/{{train,val}}2017/*{self.SUFFIXES[name][0]}",
        )
        masks = by_stem_files(root / "annotations" / sub, (".png",))
        for image in self.images_in(root / "images" / sub):
            stems = (f"{image.stem}{s.removesuffix('.png')}" for s in self.SUFFIXES[name])
            target = next((masks[s] for s in stems if s in masks), None)
            self.items.append(FileItem(image.stem, image, target))
        self.objects = name == "coco-object"
        self.class_names = list(COCO_OBJECT_CLASSES if self.objects else COCO_STUFF_CLASSES)
        self.num_classes = len(self.class_names)

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        image = self.read_image(item)
        ids = self.read_ids(item, image, None)
        if (
            self.objects
            and item.target is not None
            and item.target.name.endswith("_labelTrainIds.png")
        ):  # the COCO-Object conversion: things shift by one, stuff and unlabelled -> 0
            ids = np.where(ids < COCO_THINGS, ids + 1, 0)
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


def _named(cls: type) -> Any:
    def build(name: str, arg: str, split: str, spec: str) -> Any:
        if not arg:
            raise SpecError(f"{name} needs a directory: {name}:DIR")
        return cls(name, spec, split, Path(arg).expanduser())

    return build


register_dataset("context60", "context59")(_named(PascalContext))
register_dataset("coco-object", "coco-stuff")(_named(COCOSegmentation))
