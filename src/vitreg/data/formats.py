"""Readers for the standard layouts: ImageFolder, VOC (masks, XML boxes), ADE20k, NYUv2 depth.

Folders are listed when the dataset is opened (a missing folder, or one without images, is an
:class:`InputError` then); files are read on ``dataset[i]``, where bad samples are counted and
raise :class:`SkipSample` (see :mod:`vitreg.data.datasets`). Repairs follow the standard
protocols: mask ids outside the label set become :data:`IGNORE_INDEX`, depth <= 0 or non-finite
becomes NaN; both are counted in pixels (a depth map with no valid pixel at all is skipped).

Every file is size-checked before it is decoded: images, masks and PNG depth maps from their
header, ``.npy`` depth maps from the array header (shape, dtype, and that the file really holds
that many bytes), against the dataset's pixel budget ``max_pixels`` (default
:data:`~vitreg.data.folder.MAX_PIXELS`); over-budget files are skipped and counted.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from vitreg.core.containment import outside
from vitreg.data.datasets import IGNORE_INDEX, BaseDataset, Sample, register_dataset
from vitreg.data.folder import (
    DECODE_ERRORS,
    IMAGE_SUFFIXES,
    MAX_PIXELS,
    PixelBudgetError,
    UnusableImage,
    list_images,
    load_image,
    open_image,
    walk_folder,
)
from vitreg.errors import InputError, SpecError

SPLIT_SEED = 0
VAL_FRACTION = 0.2
IMAGE_ORDER = tuple(sorted(IMAGE_SUFFIXES, key=lambda s: (s != ".jpg", s)))
READ_ERRORS = (UnidentifiedImageError, *DECODE_ERRORS)

VOC_CLASSES = [
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat",
    "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant",
    "sheep", "sofa", "train", "tvmonitor",
]  # fmt: skip
ADE20K_CLASSES = [
    "wall", "building", "sky", "floor", "tree", "ceiling", "road", "bed", "windowpane", "grass",
    "cabinet", "sidewalk", "person", "earth", "door", "table", "mountain", "plant", "curtain",
    "chair", "car", "water", "painting", "sofa", "shelf", "house", "sea", "mirror", "rug",
    "field", "armchair", "seat", "fence", "desk", "rock", "wardrobe", "lamp", "bathtub",
    "railing", "cushion", "base", "box", "column", "signboard", "chest of drawers", "counter",
    "sand", "sink", "skyscraper", "fireplace", "refrigerator", "grandstand", "path", "stairs",
    "runway", "case", "pool table", "pillow", "screen door", "stairway", "river", "bridge",
    "bookcase", "blind", "coffee table", "toilet", "flower", "book", "hill", "bench",
    "countertop", "stove", "palm", "kitchen island", "computer", "swivel chair", "boat", "bar",
    "arcade machine", "hovel", "bus", "towel", "light", "truck", "tower", "chandelier",
    "awning", "streetlight", "booth", "television receiver", "airplane", "dirt track",
    "apparel", "pole", "land", "bannister", "escalator", "ottoman", "bottle", "buffet",
    "poster", "stage", "van", "ship", "fountain", "conveyer belt", "canopy", "washer",
    "plaything", "swimming pool", "stool", "barrel", "basket", "waterfall", "tent", "bag",
    "minibike", "cradle", "oven", "ball", "food", "step", "tank", "trade name", "microwave",
    "pot", "animal", "bicycle", "lake", "dishwasher", "screen", "blanket", "sculpture", "hood",
    "sconce", "vase", "traffic light", "tray", "ashcan", "fan", "pier", "crt screen", "plate",
    "monitor", "bulletin board", "shower", "radiator", "glass", "clock", "flag",
]  # fmt: skip


@dataclass(frozen=True)
class FileItem:
    """One sample on disk: its image, its target file (mask/depth/XML) and class label."""

    key: str
    image: Path
    target: Path | None = None
    label: int | None = None


class FileDataset(BaseDataset):
    """A list of :class:`FileItem`; shared image reading and a stat-based fingerprint.

    ``max_pixels`` is the pixel budget of every image, mask and depth map read (set it on the
    instance to change it).
    """

    max_pixels: int = MAX_PIXELS

    def __init__(self, name: str, spec: str, split: str, targets: tuple[str, ...]) -> None:
        super().__init__(name, spec, split, targets)
        self.items: list[FileItem] = []

    def __len__(self) -> int:
        return len(self.items)

    def _fingerprint_parts(self) -> Iterable[Any]:
        for item in self.items:
            yield [item.key, item.label, _stat(item.image), _stat(item.target)]

    def read_image(self, item: FileItem) -> Image.Image:
        if not item.image.exists():
            raise self.skip("missing_image", item.key)
        if not item.image.is_file():
            raise self.skip("not_a_regular_file", item.key)
        try:
            img, mode = load_image(item.image, self.max_pixels)
        except PixelBudgetError:
            raise self.skip("image_over_pixel_budget", item.key) from None
        except UnusableImage:
            raise self.skip("image_values_unusable", item.key) from None
        except READ_ERRORS:
            raise self.skip("unreadable_image", item.key) from None
        if mode is not None:
            self.log.count("converted_to_rgb", key=item.key)
        return img

    def listed(self, folder: Path, count: bool = True) -> list[Path]:
        """Regular files under ``folder``; entries the walk does not read (hidden, dangling
        links, symlink loops, FIFOs, ...) are counted by reason when ``count``."""
        files, skipped = walk_folder(folder)
        if not files:
            list_images(folder)  # the error that says why
        if count:
            for s in skipped:
                self.log.count(s.reason, key=s.path.relative_to(folder).as_posix())
        return files

    def images_in(self, folder: Path) -> list[Path]:
        """Image files under ``folder`` (other files counted); none at all is an error."""
        images = []
        for p in self.listed(folder):
            if p.suffix.lower() in IMAGE_SUFFIXES:
                images.append(p)
            else:
                self.log.count("not_an_image_file", key=p.relative_to(folder).as_posix())
        if not images:
            raise InputError(f"no images in {folder}; add .jpg/.png files")
        return images

    def read_ids(self, item: FileItem, image: Image.Image, palette: dict[int, int] | None):
        """Integer class-id map of the item's mask; skip if missing, unreadable or mis-sized."""
        if item.target is None:
            raise self.skip("missing_mask", item.key)
        try:
            with open_image(item.target, self.max_pixels) as m:
                if m.size != image.size:  # checked from the header, before decoding
                    raise self.skip("mask_size_mismatch", item.key)
                m.load()
                ids = _mask_ids(m, palette)
        except PixelBudgetError:
            raise self.skip("mask_over_pixel_budget", item.key) from None
        except READ_ERRORS:
            raise self.skip("unreadable_mask", item.key) from None
        if ids is None:
            raise self.skip("mask_not_single_channel", item.key)
        if ids.shape != (image.height, image.width):
            raise self.skip("mask_size_mismatch", item.key)
        return ids

    def unknown_to_ignore(self, ids: np.ndarray, bad: np.ndarray, key: str) -> np.ndarray:
        """Set ``bad`` pixels to IGNORE_INDEX and count them."""
        n_bad = int(bad.sum())
        if n_bad:
            self.log.count("unknown_class_pixels", n_bad, key=key)
            ids = np.where(bad, IGNORE_INDEX, ids)
        return ids.astype(np.int64)


# ---------------------------------------------------------------- ImageFolder
class ImageFolderDataset(FileDataset):
    """``DIR/<class>/<image>``, or ``DIR/{train,val}/<class>/<image>``; labels by sorted class."""

    def __init__(self, spec: str, split: str, root: Path) -> None:
        super().__init__("imagefolder", spec, split, ("label",))
        split_dirs = {s: root / s for s in ("train", "val")}
        presplit = any(d.is_dir() for d in split_dirs.values())
        if presplit and not split_dirs[split].is_dir():
            raise InputError(f"{root} has a train/ or val/ folder but no {split}/; add it")
        roots = [d for d in split_dirs.values() if d.is_dir()] if presplit else [root]
        listed = {
            r: self._classified(r, count=(r == split_dirs[split] or not presplit)) for r in roots
        }
        self.class_names = sorted({c for files in listed.values() for c, _ in files})
        self.num_classes = len(self.class_names)
        if not self.class_names:
            raise InputError(
                f"no images in class subfolders of {root}; imagefolder:DIR expects "
                "DIR/<class>/<image> (or DIR/train/<class>/..., DIR/val/<class>/...)"
            )
        index = {c: i for i, c in enumerate(self.class_names)}
        files = listed[split_dirs[split]] if presplit else _stratified(listed[root], split)
        self.items = [FileItem(p.relative_to(root).as_posix(), p, None, index[c]) for c, p in files]

    def _classified(self, root: Path, count: bool) -> list[tuple[str, Path]]:
        """``(class, path)`` for images in ``root/<class>/``; other files are counted."""
        out = []
        for p in self.listed(root, count):
            rel = p.relative_to(root)
            if p.suffix.lower() not in IMAGE_SUFFIXES:
                reason = "not_an_image_file"
            elif len(rel.parts) < 2:
                reason = "image_outside_class_folder"
            else:
                out.append((rel.parts[0], p))
                continue
            if count:
                self.log.count(reason, key=rel.as_posix())
        return out

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        return Sample(self.read_image(item), item.key, label=item.label)

    def warnings(self) -> list[str]:
        """Fewer than two classes overall, or in this split's images (from the listing)."""
        out = super().warnings()
        present = sorted({item.label for item in self.items if item.label is not None})
        if not out and len(present) == 1 and self.class_names:
            out.append(
                f"the {self.split} split of {self.spec} holds images of one class only "
                f"({self.class_names[present[0]]}): its classification scores say nothing"
            )
        return out


def _stratified(files: list[tuple[str, Path]], split: str) -> list[tuple[str, Path]]:
    """Seeded 80/20 split within each class (every class with >= 2 images gets a val image)."""
    out = []
    for c in sorted({c for c, _ in files}):
        members = sorted(p for cc, p in files if cc == c)
        out += [(c, p) for p in _split_list(members, split)]
    return out


def _split_list(members: list, split: str) -> list:
    n = len(members)
    n_val = max(1, round(VAL_FRACTION * n)) if n >= 2 else 0
    val = set(np.random.default_rng(SPLIT_SEED).permutation(n)[:n_val].tolist())
    return [m for j, m in enumerate(members) if (j in val) == (split == "val")]


# ---------------------------------------------------------------- VOC
def voc_palette() -> dict[int, int]:
    """VOC colour (packed 0xRRGGBB) -> class id, for masks saved as RGB instead of palette PNG."""
    out = {}
    for cid in [*range(len(VOC_CLASSES)), IGNORE_INDEX]:
        rgb, c = [0, 0, 0], cid
        for bit in range(8):
            for ch in range(3):
                rgb[ch] |= ((c >> ch) & 1) << (7 - bit)
            c >>= 3
        out[(rgb[0] << 16) | (rgb[1] << 8) | rgb[2]] = cid
    return out


class VOCSegmentation(FileDataset):
    """VOC2012 ``SegmentationClass`` masks: ids 0..20, 255 (object boundary) stays ignored."""

    def __init__(self, spec: str, split: str, root: Path) -> None:
        super().__init__("voc", spec, split, ("mask",))
        root = _voc_root(root)
        ids = voc_ids(root, "Segmentation", root / "SegmentationClass", ".png", split)
        images = by_stem_files(root / "JPEGImages", IMAGE_ORDER)
        masks = by_stem_files(root / "SegmentationClass", (".png",))
        self.items = [
            FileItem(k, images.get(k, root / "JPEGImages" / k), masks.get(k)) for k in ids
        ]
        self.class_names = list(VOC_CLASSES)
        self.num_classes = len(VOC_CLASSES)
        self._palette = voc_palette()

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        image = self.read_image(item)
        ids = self.read_ids(item, image, self._palette)
        bad = (ids >= self.num_classes) & (ids != IGNORE_INDEX)
        return Sample(image, item.key, mask=self.unknown_to_ignore(ids, bad, item.key))


class VOCBoxes(FileDataset):
    """Object boxes from ``Annotations/*.xml`` (all objects, difficult ones included)."""

    def __init__(self, spec: str, split: str, root: Path) -> None:
        super().__init__("voc-boxes", spec, split, ("boxes",))
        root = _voc_root(root)
        ids = voc_ids(root, "Main", root / "Annotations", ".xml", split)
        images = by_stem_files(root / "JPEGImages", IMAGE_ORDER)
        xml = root / "Annotations"
        self.items = [
            FileItem(k, images.get(k, root / "JPEGImages" / k), xml / f"{k}.xml") for k in ids
        ]

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        image = self.read_image(item)
        if item.target.is_symlink() and outside(item.target.parent, item.target) is not None:
            raise self.skip(
                "link_outside", item.key
            )  # containment: no link leads out of the dataset
        try:
            raw, size = read_voc_boxes(item.target)
        except (ET.ParseError, OSError, ValueError, TypeError, AttributeError):
            raise self.skip("unreadable_annotation", item.key) from None
        if size is not None and size != image.size:
            self.log.count("annotation_size_mismatch", key=item.key)
        w, h = image.size
        boxes = np.clip(raw, 0, [w, h, w, h]).astype(np.float32)
        if not np.array_equal(boxes, raw):
            self.log.count("boxes_clipped", key=item.key)
        # layout: box coordinates (x0, y0, x1, y1), not tokens
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        if not keep.all():
            self.log.count("empty_boxes", int((~keep).sum()), key=item.key)
        if not keep.any():
            raise self.skip("no_boxes", item.key)
        return Sample(image, item.key, boxes=boxes[keep])


def read_voc_boxes(path: Path) -> tuple[np.ndarray, tuple[int, int] | None]:
    """Boxes ``(K, 4)`` xyxy (0-based pixel edges) and the ``(width, height)`` an XML declares.

    VOC stores 1-based inclusive pixel indices, so ``xmin - 1`` and ``xmax`` are the edges.
    ElementTree does not fetch external entities or DTDs.
    """
    tree = ET.parse(path)
    boxes = []
    for obj in tree.getroot().iter("object"):
        bb = obj.find("bndbox")
        if bb is None:
            continue
        x0, y0, x1, y1 = (float(bb.findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax"))
        boxes.append([x0 - 1, y0 - 1, x1, y1])
    size = tree.getroot().find("size")
    wh = None
    if size is not None and size.findtext("width") and size.findtext("height"):
        wh = (int(float(size.findtext("width"))), int(float(size.findtext("height"))))
    return np.asarray(boxes, dtype=np.float32).reshape(-1, 4), wh


def layout_root(root: Path, nested: tuple[str, ...], marker: str, missing: str) -> Path:
    """The dataset's own folder: ``root`` or the first of ``root/nested...`` holding ``marker``
    (datasets are unpacked with or without their top folders); else an error saying ``missing``."""
    for cand in (root, *(root / n for n in nested)):
        if (cand / marker).is_dir():
            return cand
    raise InputError(f"no {marker}/ in {root}; {missing}")


def _voc_root(root: Path) -> Path:
    return layout_root(
        root,
        ("VOC2012", "VOCdevkit/VOC2012"),
        "JPEGImages",
        "voc:DIR expects the VOC2012 layout (JPEGImages/, SegmentationClass/, Annotations/, "
        "ImageSets/Segmentation/{train,val}.txt)",
    )


def voc_ids(root: Path, imageset: str, folder: Path, suffix: str, split: str) -> list[str]:
    """Ids listed in ``ImageSets/<imageset>/<split>.txt``, else a seeded 80/20 of ``folder``."""
    listing = root / "ImageSets" / imageset / f"{split}.txt"
    if listing.is_file():
        ids = [ln.split()[0] for ln in listing.read_text().splitlines() if ln.strip()]
        bad = next((i for i in ids if Path(i).name != i or i in (".", "..")), None)
        if bad is not None:  # an id names a file inside the dataset folder
            raise InputError(
                f"{listing} lists {bad[:80]!r}, not an image id (a file name without folders); "
                "vitreg reads nothing outside the dataset folder"
            )
    else:
        if not folder.is_dir():
            raise InputError(f"neither {listing} nor {folder}/ exists in {root}")
        ids = _split_list(sorted(p.stem for p in folder.glob(f"*{suffix}")), split)
    if not ids:
        raise InputError(f"no {split} samples in {root} ({listing} or {folder}/ is empty)")
    return ids


# ---------------------------------------------------------------- ADE20k
class ADE20k(FileDataset):
    """ADEChallengeData2016: label 0 = other (ignored), 1..150 -> 0..149."""

    def __init__(self, spec: str, split: str, root: Path) -> None:
        super().__init__("ade20k", spec, split, ("mask",))
        sub = {"train": "training", "val": "validation"}[split]
        root = layout_root(
            root,
            ("ADEChallengeData2016",),
            f"images/{sub}",
            "ade20k:DIR expects the ADEChallengeData2016 layout (images/{training,validation}/, "
            "annotations/{training,validation}/)",
        )
        masks = by_stem_files(root / "annotations" / sub, (".png",))
        images = self.images_in(root / "images" / sub)
        self.items = [FileItem(p.stem, p, masks.get(p.stem)) for p in images]
        self.class_names = list(ADE20K_CLASSES)
        self.num_classes = len(ADE20K_CLASSES)

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        image = self.read_image(item)
        raw = self.read_ids(item, image, None)
        bad = raw > self.num_classes
        ids = np.where(raw == 0, IGNORE_INDEX, raw - 1)
        return Sample(image, item.key, mask=self.unknown_to_ignore(ids, bad, item.key))


# ---------------------------------------------------------------- NYUv2 depth
class NYUDepth(FileDataset):
    """``DIR/<split>/rgb/NAME.jpg`` + ``DIR/<split>/depth/NAME.png`` (mm) or ``.npy`` (metres)."""

    def __init__(self, spec: str, split: str, root: Path) -> None:
        super().__init__("nyu", spec, split, ("depth",))
        rgb, depth = root / split / "rgb", root / split / "depth"
        if not rgb.is_dir():
            raise InputError(
                f"no {rgb}/; nyu:DIR expects DIR/{{train,val}}/rgb/NAME.jpg and "
                "DIR/{train,val}/depth/NAME.png (millimetres) or NAME.npy (metres)"
            )
        depths = by_stem_files(depth, (".png", ".npy")) if depth.is_dir() else {}
        self.items = [FileItem(p.stem, p, depths.get(p.stem)) for p in self.images_in(rgb)]

    def _read(self, i: int) -> Sample:
        item = self.items[i]
        image = self.read_image(item)
        if item.target is None:
            raise self.skip("missing_depth", item.key)
        try:
            depth = read_depth(item.target, self.max_pixels)
        except PixelBudgetError:
            raise self.skip("depth_over_pixel_budget", item.key) from None
        except READ_ERRORS:
            raise self.skip("unreadable_depth", item.key) from None
        if depth is None:
            raise self.skip("depth_not_single_channel", item.key)
        if depth.shape != (image.height, image.width):
            raise self.skip("depth_size_mismatch", item.key)
        bad = ~np.isfinite(depth) | (depth <= 0)
        if bad.all():  # nothing to train on or score against
            raise self.skip("no_valid_depth", item.key)
        if bad.any():
            self.log.count("invalid_depth_pixels", int(bad.sum()), key=item.key)
            depth = np.where(bad, np.nan, depth).astype(np.float32)
        return Sample(image, item.key, depth=depth)


def read_depth(path: Path, max_pixels: int = MAX_PIXELS) -> np.ndarray | None:
    """Depth in metres: ``.npy`` as stored, ``.png`` divided by 1000 (millimetres); ``None`` if
    the map is not single-channel. The size is checked from the header before anything is read:
    above ``max_pixels`` raises :class:`PixelBudgetError`; a ``.npy`` file shorter than its
    header says, or of a non-numeric dtype, raises ``ValueError``."""
    if path.suffix.lower() == ".npy":
        shape, dtype, offset = npy_header(path)
        if len(shape) == 3 and shape[-1] == 1:
            shape = shape[:2]
        if len(shape) != 2:
            return None
        pixels = int(shape[0]) * int(shape[1])
        if pixels > max_pixels:
            raise PixelBudgetError(
                f"declares {shape[1]}×{shape[0]} = {pixels:,} pixels, above the budget of "
                f"{max_pixels:,}",
                pixels,
                max_pixels,
            )
        if os.path.getsize(path) < offset + pixels * dtype.itemsize:
            raise ValueError(f"{path.name} is shorter than its header declares ({shape} {dtype})")
        arr = np.load(path, allow_pickle=False)
        arr = arr[..., 0] if arr.ndim == 3 and arr.shape[-1] == 1 else arr
        return arr.astype(np.float32) if arr.ndim == 2 else None
    with open_image(path, max_pixels) as img:
        if img.mode not in ("I;16", "I;16B", "I;16L", "I", "L", "F"):
            return None
        img.load()
        return np.asarray(img, dtype=np.float32) / 1000.0


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset a ``.npy`` file declares, read from its header alone (no
    data is read or allocated); ``ValueError`` for a non-numeric dtype."""
    fmt = np.lib.format
    with open(path, "rb") as f:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(f".npy format version {version} is not read (1.0 and 2.0 are)")
        offset = f.tell()
    if dtype.kind not in "biuf":
        raise ValueError(f"{path.name} holds {dtype} values, not numbers")
    return tuple(int(d) for d in shape), dtype, offset


# ---------------------------------------------------------------- helpers
def _mask_ids(img: Image.Image, palette: dict[int, int] | None) -> np.ndarray | None:
    """Class ids of a palette/greyscale mask (or an RGB one, via ``palette`` or if grey)."""
    if img.mode in ("P", "L", "I", "I;16", "I;16B", "I;16L"):
        return np.asarray(img).astype(np.int64)
    if img.mode not in ("RGB", "RGBA"):
        return None
    rgb = np.asarray(img.convert("RGB")).astype(np.int64)
    if palette is None:
        grey = (rgb[..., 0] == rgb[..., 1]) & (rgb[..., 1] == rgb[..., 2])
        return rgb[..., 0] if grey.all() else None
    packed = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    codes, inverse = np.unique(packed, return_inverse=True)
    lut = np.array([palette.get(int(c), 1 << 16) for c in codes], dtype=np.int64)
    return lut[inverse.reshape(packed.shape)]  # unknown colours -> an id no class has


def by_stem_files(folder: Path, suffixes: Iterable[str] = ()) -> dict[str, Path]:
    """``stem -> path`` of the files in ``folder`` (first suffix in ``suffixes`` wins); a link
    that leads outside the folder is left out, so its sample counts as having no target."""
    if not folder.is_dir():
        return {}
    order = {s: j for j, s in enumerate(suffixes)}
    files = [
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and outside(folder, p) is None  # contained
    ]
    if order:
        files = [p for p in files if p.suffix.lower() in order]
    out: dict[str, Path] = {}
    for p in sorted(files, key=lambda p: (order.get(p.suffix.lower(), 0), p.name), reverse=True):
        out[p.stem] = p
    return out


def _stat(path: Path | None) -> list | None:
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return None if st is None else [path.name, st.st_size, st.st_mtime_ns]


def _dir_arg(name: str, arg: str) -> Path:
    if not arg:
        raise SpecError(f"{name} needs a directory: {name}:DIR")
    return Path(arg).expanduser()


FOLDER_FORMATS: dict[str, type] = {
    "imagefolder": ImageFolderDataset,
    "voc": VOCSegmentation,
    "voc-boxes": VOCBoxes,
    "ade20k": ADE20k,
    "nyu": NYUDepth,
}


def _folder_builder(cls: type) -> Callable[..., Any]:
    """The ``name:DIR`` builder of a folder format."""

    def build(name: str, arg: str, split: str, spec: str) -> Any:
        return cls(spec, split, _dir_arg(name, arg))

    return build


for _name, _cls in FOLDER_FORMATS.items():
    register_dataset(_name)(_folder_builder(_cls))
