"""Seeded synthetic shapes with known answers: class masks, depth, boxes and a label per image.

Each image has a flat or textured background (a tilted plane about 4-6.5 m away) and 1-3 shapes
(square, disc, triangle; random colour, so only the outline tells the class) each at its own
depth of 1-3.5 m, painted far to near so occlusion agrees with depth. With ``hue=1`` each class
paints its shapes in its own jittered hue (square red, disc green, triangle blue), so colour
tells the class too: a label that even a random-weight model's pooled tokens carry (the offline
probe demo). Masks hold class ids
(0 = background), boxes enclose each shape's visible pixels, the label is the class of the shape
with the most visible pixels. Item ``i`` depends only on ``(seed, split, i)``, so items are drawn
lazily and train/val never share images. Specs: ``synthetic-seg:n=200,size=64,seed=0`` and
``synthetic-depth``, ``synthetic-boxes``, ``synthetic-cls``, ``synthetic`` (all targets), each
with ``hue=1`` as an option.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image
from pydantic import JsonValue

from vitreg.data.datasets import TARGETS, BaseDataset, Sample, register_dataset
from vitreg.errors import SpecError

GENERATOR_VERSION = 1  # bump when the drawing changes, so cached features are not reused
CLASS_NAMES = ["background", "square", "disc", "triangle"]
VARIANTS: dict[str, tuple[str, ...]] = {
    "synthetic-seg": ("mask",),
    "synthetic-depth": ("depth",),
    "synthetic-boxes": ("boxes",),
    "synthetic-cls": ("label",),
    "synthetic": TARGETS,
}
DEFAULTS = {"n": 200, "size": 64, "seed": 0, "hue": 0}
# the class hues of hue=1 (RGB; row 0, the background, is unused)
PALETTE = np.array([[0, 0, 0], [215, 50, 45], [45, 190, 65], [50, 80, 225]], float)
HUE_JITTER = 0.25  # share of the random colour kept around the class hue (about ±32 levels)
MIN_SIZE = 16
MAX_SIZE = 4096  # pixels per side (models.input_size.MAX_IMG_SIZE): one image stays < 1 GiB
MAX_N = 10_000_000  # images per split (rendered lazily; a bound on the run, not memory)
MAX_SEED = 2**32 - 1  # numpy's seed range
SPLIT_CODE = {"train": 0, "val": 1}


@dataclass(frozen=True)
class Scene:
    """One drawn image and every answer about it (shapes listed far to near)."""

    image: np.ndarray  # (S, S, 3) uint8
    mask: np.ndarray  # (S, S) int64 class ids, 0 = background
    instances: np.ndarray  # (S, S) int64, 0 = background, k + 1 = shape k
    depth: np.ndarray  # (S, S) float32 metres, finite and > 0
    classes: np.ndarray  # (K,) class id of each visible shape
    shape_depths: np.ndarray  # (K,) metres
    boxes: np.ndarray  # (K, 4) float32 xyxy pixel edges of each shape's visible pixels
    label: int  # class of the shape with the most visible pixels


def _inside(cls: int, x: np.ndarray, y: np.ndarray, cx: float, cy: float, r: float):
    if cls == 1:  # square of half-side r
        return np.maximum(abs(x - cx), abs(y - cy)) <= r
    if cls == 2:  # disc of radius r
        return (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    return (y <= cy + r) & (abs(x - cx) <= (y - cy + r) / 2)  # upright triangle, base 2r


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    if rng.random() < 0.5:  # flat colour
        return np.broadcast_to(rng.uniform(0, 255, 3), (size, size, 3)).astype(np.float64)
    cells = int(rng.integers(3, 9))
    lattice = rng.integers(0, 256, (cells, cells, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(lattice).resize((size, size), Image.BILINEAR), float)
    return smooth + rng.normal(0, 12, (size, size, 3))  # value noise + grain


def render(seed: int, split: str, index: int, size: int = DEFAULTS["size"], hue: int = 0) -> Scene:
    """Draw item ``index`` of ``split`` for ``seed`` (pure function of its arguments); ``hue``
    paints each shape in its class's hue (the same scene otherwise)."""
    rng = np.random.default_rng([seed, SPLIT_CODE[split], index])
    c = np.arange(size) + 0.5
    x, y = np.meshgrid(c, c)
    image = _background(rng, size)
    depth = rng.uniform(4, 5) + rng.uniform(0, 1.5) * (1 - y / size)
    depth = depth + rng.uniform(-0.5, 0.5) * (x / size - 0.5)
    mask = np.zeros((size, size), np.int64)
    instances = np.zeros((size, size), np.int64)
    k = int(rng.integers(1, 4))
    classes = rng.integers(1, 4, k)
    radii = rng.uniform(0.12, 0.28, k) * size
    centres = rng.uniform(radii[:, None], size - radii[:, None], (k, 2))
    depths = rng.uniform(1.0, 3.5, k)
    colours = rng.uniform(0, 255, (k, 3))
    if hue:
        colours = np.clip(PALETTE[classes] + HUE_JITTER * (colours - 127.5), 0, 255)
    order = np.argsort(-depths)  # far first, near shapes occlude
    for j, s in enumerate(order):
        inside = _inside(int(classes[s]), x, y, *centres[s], radii[s])
        image[inside] = colours[s]
        depth[inside] = depths[s]
        mask[inside] = classes[s]
        instances[inside] = j + 1
    visible = [j for j in range(k) if (instances == j + 1).any()]
    boxes = []
    for j in visible:
        rows, cols = np.nonzero(instances == j + 1)
        boxes.append([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1])
    instances = np.searchsorted([0, *(j + 1 for j in visible)], instances)  # renumber 1..K
    areas = np.bincount(instances.ravel(), minlength=len(visible) + 1)[1:]
    kept = order[visible]
    return Scene(
        image=np.clip(image, 0, 255).astype(np.uint8),
        mask=mask,
        instances=instances,
        depth=depth.astype(np.float32),
        classes=classes[kept],
        shape_depths=depths[kept],
        boxes=np.asarray(boxes, np.float32).reshape(-1, 4),
        label=int(classes[kept][np.argmax(areas)]),
    )


class SyntheticShapes(BaseDataset):
    """``n`` lazily drawn scenes; only the targets of the chosen variant are filled in."""

    def __init__(
        self, name: str, spec: str, split: str, n: int, size: int, seed: int, hue: int = 0
    ) -> None:
        super().__init__(name, spec, split, VARIANTS[name])
        self.n, self.size, self.seed, self.hue = n, size, seed, hue
        self.num_classes = len(CLASS_NAMES)
        self.class_names = list(CLASS_NAMES)

    def __len__(self) -> int:
        return self.n

    def _read(self, i: int) -> Sample:
        scene = render(self.seed, self.split, i, self.size, self.hue)
        want = set(self.targets)
        return Sample(
            image=Image.fromarray(scene.image),
            key=f"synthetic/{i:06d}",
            label=scene.label if "label" in want else None,
            mask=scene.mask if "mask" in want else None,
            depth=scene.depth if "depth" in want else None,
            boxes=scene.boxes if "boxes" in want else None,
        )

    def _fingerprint_parts(self) -> Iterable[Any]:
        yield ["synthetic", GENERATOR_VERSION, self.n, self.size, self.seed, self.split]
        yield list(self.targets)
        if self.hue:  # the plain scenes keep the cache keys they always had
            yield ["hue", self.hue]

    def describe(self) -> dict[str, JsonValue]:
        params = {"n": self.n, "size": self.size, "seed": self.seed, "hue": self.hue}
        return {**super().describe(), "params": params}


def parse_params(arg: str) -> dict[str, int]:
    """``"n=200,size=64"`` -> ``{"n": 200, "size": 64, "seed": 0}`` (defaults filled in)."""
    params = dict(DEFAULTS)
    for part in filter(None, (p.strip() for p in arg.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip()
        if key not in DEFAULTS or not eq:
            raise SpecError(
                f"bad synthetic parameter {part!r}; use key=int with keys {list(DEFAULTS)}"
            )
        try:
            if len(value.strip()) > 20:  # above every bound below; never a 5000-digit parse
                raise ValueError(value)
            params[key] = int(value)
        except ValueError:
            raise SpecError(
                f"synthetic parameter {key} must be an integer of at most 20 digits, got "
                f"{value[:40]!r}"
            ) from None
    if not (
        1 <= params["n"] <= MAX_N
        and MIN_SIZE <= params["size"] <= MAX_SIZE
        and 0 <= params["seed"] <= MAX_SEED
        and params["hue"] in (0, 1)
    ):
        raise SpecError(
            f"synthetic needs 1 <= n <= {MAX_N:,}, {MIN_SIZE} <= size <= {MAX_SIZE}, "
            f"0 <= seed <= {MAX_SEED}, hue 0 or 1; got {params}"
        )
    return params


@register_dataset(*VARIANTS)
def _synthetic(name: str, arg: str, split: str, spec: str) -> SyntheticShapes:
    try:
        params = parse_params(arg)
    except SpecError as e:
        raise SpecError(f"--data {spec[:80]!r}: {e}") from None
    return SyntheticShapes(name, spec, split, **params)
