"""Image sources for ``diagnose``: a folder, the bundled sample photos, or synthetic images.

Each source yields batches in the model's input space (through ``model.transform``), keeps the
first few images in display form ([0, 1] RGB at the model's input size) for report figures, and
describes what was used -- source, image count, converted and skipped files -- once iterated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
from PIL import Image
from pydantic import JsonValue

from vitreg.data.folder import MAX_PIXELS, FolderLog, iter_folder, list_images
from vitreg.errors import InputError
from vitreg.models.model import Model
from vitreg.results.schema import DataInfo, data_info

SYNTHETIC_SEED = 0
SYNTHETIC_FLAT_FRACTION = 0.1  # flat background on ~10% of each image: a few % outliers


class ImageSource:
    """Batches for one model, the description of the data, and display copies of the first images.

    Iterate it once (``Model.trace`` does); :meth:`description` is complete after that.
    """

    def __init__(
        self,
        model: Model,
        batches: Callable[[], Iterable[torch.Tensor]],
        description: dict[str, JsonValue],
        total: int,
        keep: int = 8,
        log: FolderLog | None = None,
    ) -> None:
        self.model = model
        self._batches = batches
        self._description = description
        self.total = total
        self.keep = keep
        self.log = log
        self.n_images = 0
        self._shown: list[torch.Tensor] = []

    def __iter__(self) -> Iterator[torch.Tensor]:
        self.n_images = 0
        self._shown = []
        for batch in self._batches():
            if len(self._shown) < self.keep:
                self._shown += list(batch[: self.keep - len(self._shown)].float())
            self.n_images += batch.shape[0]
            yield batch

    @property
    def label(self) -> str:
        """What the images are, in words (e.g. ``the folder /data/val``)."""
        return str(self._description.get("description", self._description.get("source")))

    @property
    def synthetic(self) -> bool:
        return bool(self._description.get("synthetic"))

    def display_images(self) -> torch.Tensor | None:
        """The first ``keep`` images seen, as ``[k, 3, H, W]`` in [0, 1] (``None`` before any)."""
        if not self._shown:
            return None
        return to_display(torch.stack(self._shown), self.model)

    def description(self) -> DataInfo:
        """metrics.json's data block: what the images are, how many were used, which files were
        converted or skipped (sorted), plus the source's details."""
        log = self.log if self.log is not None else FolderLog()
        return data_info(
            {
                **self._description,
                "n_images": self.n_images,
                "converted": dict(log.converted),
                "skipped": dict(sorted(log.skipped.items())),
            }
        )


def to_display(x: torch.Tensor, model: Model) -> torch.Tensor:
    """Undo the transform's normalisation (mean/std of the model's data config) into [0, 1]."""
    try:
        cfg = model.adapter.data_config()
        mean = torch.tensor(cfg["mean"], dtype=x.dtype).view(1, 3, 1, 1)
        std = torch.tensor(cfg["std"], dtype=x.dtype).view(1, 3, 1, 1)
    except (NotImplementedError, KeyError, TypeError):  # no data config: assume [0, 1] input
        return x.clamp(0, 1)
    return (x * std + mean).clamp(0, 1)


def input_size(model: Model) -> int:
    """The square side the model takes by default (synthetic images are drawn at that size)."""
    h, w = model.adapter.default_image_size()
    return min(int(h), int(w))


def _pil_batches(
    model: Model, images: list[Image.Image], batch_size: int
) -> Iterator[torch.Tensor]:
    for start in range(0, len(images), batch_size):
        yield model.preprocess(images[start : start + batch_size])


def folder_images(
    model: Model,
    directory: str | Path,
    batch_size: int = 32,
    limit: int | None = None,
    keep: int = 8,
    max_pixels: int = MAX_PIXELS,
) -> ImageSource:
    """Every readable image under ``directory``; every other entry is skipped and listed.

    Images declaring more than ``max_pixels`` pixels are skipped before decoding (see
    :mod:`vitreg.data.folder`). An empty or missing folder raises :class:`InputError` here,
    before any model work.
    """
    files = list_images(directory)
    log = FolderLog()
    total = min(len(files), limit) if limit is not None else len(files)

    def batches() -> Iterator[torch.Tensor]:
        for record in (log.used, log.converted, log.skipped):  # a fresh record per pass
            record.clear()
        yield from iter_folder(directory, model.transform, batch_size, limit, log, max_pixels)

    path = str(Path(directory).expanduser())
    desc = {
        "source": "folder",
        "description": f"the folder {path}",
        "path": path,
        "synthetic": False,
        "max_pixels": max_pixels,
    }
    return ImageSource(model, batches, desc, total, keep, log)


def sample_source(
    model: Model, batch_size: int = 32, limit: int | None = None, keep: int = 8
) -> ImageSource:
    """The photos bundled with scikit-image (public domain / CC0), preprocessed for ``model``."""
    from vitreg.data import samples

    pairs = samples.sample_images()[:limit]
    names = [name for name, _ in pairs]
    images = [img for _, img in pairs]
    desc = {
        "source": "samples",
        "description": "the photos bundled with scikit-image (" + ", ".join(names) + ")",
        "names": names,
        "credits": {n: samples.SAMPLES[n] for n in names},
        "synthetic": False,
    }
    return ImageSource(
        model, lambda: _pil_batches(model, images, batch_size), desc, len(images), keep
    )


def synthetic_source(
    model: Model,
    n: int = 16,
    batch_size: int = 32,
    seed: int = SYNTHETIC_SEED,
    flat_fraction: float = SYNTHETIC_FLAT_FRACTION,
    keep: int = 8,
) -> ImageSource:
    """``n`` synthetic textured images with flat regions (the content planted models react to)."""
    from vitreg.data.synthetic_images import synthetic_pil

    if n < 1:
        raise InputError(f"need at least one synthetic image, got {n}")
    size = input_size(model)
    desc = {
        "source": "synthetic",
        "description": f"synthetic images (textured, {flat_fraction:.0%} flat regions, seed "
        f"{seed}; not photos)",
        "synthetic": True,
        "generator": "vitreg.testing.images.synthetic_images",
        "size": size,
        "seed": seed,
        "flat_fraction": flat_fraction,
    }

    def batches() -> Iterator[torch.Tensor]:
        # the same images as synthetic_images(n, size, seed, flat_fraction), whatever the batch size
        yield from _pil_batches(model, synthetic_pil(n, size, seed, flat_fraction), batch_size)

    return ImageSource(model, batches, desc, n, keep)
