"""One geometric transform for an image and its targets, so masks, depth and boxes stay aligned.

:func:`prepare` resizes the short side to ``size`` (bilinear for the image, nearest for masks and
depth, so class ids and NaN holes survive) and centre-crops ``size x size``; boxes get the same
scale and shift, are clipped to the crop and dropped when nothing of them is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np
import torch
from PIL import Image

from vitreg.data.datasets import Sample
from vitreg.data.images import input_size
from vitreg.models.model import Model


class _Input(TypedDict):
    key: str
    image: torch.Tensor  # float32 [3,S,S], normalised


class Prepared(_Input, total=False):
    """One sample as model input: its key, the normalised image and the targets it has."""

    label: torch.Tensor  # int64 scalar
    mask: torch.Tensor  # int64 [S,S]
    depth: torch.Tensor  # float32 [S,S], NaN holes kept
    boxes: torch.Tensor  # float32 [K,4], xyxy in crop pixels


def crop_geometry(width: int, height: int, size: int) -> tuple[int, int, int, int]:
    """``(resized_w, resized_h, left, top)``: short side -> ``size``, then a centred crop."""
    scale = size / min(width, height)
    rw = size if width <= height else max(size, round(width * scale))
    rh = size if height <= width else max(size, round(height * scale))
    return rw, rh, int(round((rw - size) / 2)), int(round((rh - size) / 2))


def _resize_crop(arr: np.ndarray, geo: tuple[int, int, int, int], size: int):
    rw, rh, left, top = geo
    img = Image.fromarray(arr).resize((rw, rh), Image.NEAREST)
    return np.asarray(img)[top : top + size, left : left + size]


def prepare(sample: Sample, size: int, mean: Sequence[float], std: Sequence[float]) -> Prepared:
    """Model-ready tensors: ``image`` [3,S,S] normalised, and the sample's targets at S x S.

    ``label`` -> int64 scalar, ``mask`` -> int64 [S,S], ``depth`` -> float32 [S,S] (NaN kept),
    ``boxes`` -> float32 [K,4] xyxy in crop pixels; ``key`` is passed through.
    """
    w, h = sample.image.size
    geo = crop_geometry(w, h, size)
    rw, rh, left, top = geo
    img = sample.image.convert("RGB").resize((rw, rh), Image.BILINEAR)
    img = img.crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
    m = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
    out: Prepared = {"key": sample.key, "image": (x - m) / s}
    if sample.label is not None:
        out["label"] = torch.tensor(int(sample.label), dtype=torch.int64)
    if sample.mask is not None:
        mask = _resize_crop(np.asarray(sample.mask, dtype=np.int32), geo, size)
        out["mask"] = torch.from_numpy(mask.astype(np.int64))
    if sample.depth is not None:
        depth = _resize_crop(np.asarray(sample.depth, dtype=np.float32), geo, size)
        out["depth"] = torch.from_numpy(depth.copy())
    if sample.boxes is not None:
        out["boxes"] = torch.from_numpy(_boxes(sample.boxes, w, h, geo, size))
    return out


def _boxes(boxes: np.ndarray, w: int, h: int, geo: tuple[int, int, int, int], size: int):
    rw, rh, left, top = geo
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4) * np.array(
        [rw / w, rh / h, rw / w, rh / h], dtype=np.float32
    )
    b = np.clip(b - np.array([left, top, left, top], dtype=np.float32), 0, size)
    # layout: box coordinates (x0, y0, x1, y1), not tokens
    keep = (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])
    return b[keep]


def model_input(model: Model) -> tuple[int, tuple[float, ...], tuple[float, ...]]:
    """``(size, mean, std)`` the model expects: its default square input and normalisation.

    Models without a data config are taken to want [0, 1] input (mean 0, std 1), as
    :func:`vitreg.data.images.to_display` assumes.
    """
    try:
        cfg = model.adapter.data_config()
        mean, std = tuple(float(v) for v in cfg["mean"]), tuple(float(v) for v in cfg["std"])
    except (NotImplementedError, KeyError, TypeError):
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    return input_size(model), mean, std
