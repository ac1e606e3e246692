"""Webdataset shards as an image source: ``--images wds:PATTERN`` (e.g.
``wds:/data/train-{000000..000099}.tar``), read through the ``webdataset`` package.

Order: the shards in the order the brace pattern expands to, the samples of each shard in tar
order -- the same images in the same order as a folder holding them under sorted names. A
sample's first member with an image suffix (``.jpg``, ``.png``, ...) is its image; samples with
none, or whose image cannot be decoded, is over the pixel budget or has no faithful RGB version,
are skipped and listed with the reason, exactly as a folder's files are (see
:mod:`vitreg.data.folder`); conversions are listed too. Names in the listing are
``SHARD/KEY.EXT``.

Under torchrun every rank reads the shard stream whole and forwards its part of each global
batch (:mod:`vitreg.distributed`): that is what keeps every per-image row at its single-process
index, so 2 ranks give the numbers of 1. Splitting by DataLoader worker is webdataset's
(``split_by_worker``): with one in-process reader, as here, it is the identity.

Only local shard files are read: ``pipe:`` and URLs are refused (``pipe:`` runs a shell
command, which a data argument must never do).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from vitreg.data.folder import (
    IMAGE_SUFFIXES,
    MAX_PIXELS,
    FolderLog,
    PixelBudgetError,
    decoded_batches,
    to_rgb,
)
from vitreg.data.images import ImageSource
from vitreg.errors import InputError

PREFIX = "wds:"


def is_wds(images: str | Path | None) -> bool:
    """Whether an ``--images`` value names webdataset shards (``wds:PATTERN``)."""
    return images is not None and str(images).startswith(PREFIX)


def shard_paths(images: str | Path) -> list[Path]:
    """The shard files ``wds:PATTERN`` names, brace-expanded in order; each must be a local file."""
    try:
        import webdataset  # noqa: F401
        from braceexpand import braceexpand  # installed with webdataset
    except ImportError:
        raise InputError(
            f"--images {images} reads webdataset shards: pip install 'vitreg[wds]'"
        ) from None
    pattern = str(images)[len(PREFIX) :]
    if not pattern:
        raise InputError(
            "--images wds: needs a shard pattern, e.g. wds:/data/train-{0000..0099}.tar"
        )
    if pattern.startswith("pipe:") or "://" in pattern:
        raise InputError(
            f"--images {images}: only local shard files are read (no pipe: commands or URLs); "
            "download the shards first"
        )
    paths = [Path(p).expanduser() for p in braceexpand(pattern)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise InputError(f"--images {images}: shard file(s) not found: {shown}")
    return paths


def _suffix(key: str) -> str:
    return "." + key.rsplit(".", 1)[-1].lower()


def decode_bytes(
    data: bytes, name: str, max_pixels: int = MAX_PIXELS
) -> tuple[Image.Image, str | None]:
    """Decode one image held in memory (``name`` for messages) and convert it to 8-bit RGB, with
    the checks and errors of :func:`vitreg.data.folder.load_image` (the pixel budget first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data))
        except Image.UnidentifiedImageError:
            raise Image.UnidentifiedImageError(f"cannot identify image file {name!r}") from None
        except Image.DecompressionBombError:
            raise PixelBudgetError(
                "refused by Pillow as a decompression bomb", -1, max_pixels
            ) from None
        with img:
            w, h = img.size
            if w * h > max_pixels:
                raise PixelBudgetError(
                    f"declares {w}×{h} = {w * h:,} pixels, above the budget of {max_pixels:,}",
                    w * h,
                    max_pixels,
                )
            img.load()
            return to_rgb(img)


def iter_samples(paths: list[Path]) -> Iterator[dict]:
    """Webdataset samples (``__key__``, ``__url__`` and one entry per member) of ``paths``, in
    order, not shuffled; every rank reads every shard (see the module docstring)."""
    import webdataset as wds

    dataset = wds.WebDataset(
        [str(p) for p in paths],
        shardshuffle=False,
        nodesplitter=lambda src: src,  # the global stream on every rank; trace shards batches
        workersplitter=wds.split_by_worker,
        empty_check=False,
    )
    yield from dataset


def iter_wds(
    images: str | Path,
    transform: Callable[[Image.Image], torch.Tensor],
    batch_size: int = 32,
    limit: int | None = None,
    log: FolderLog | None = None,
    max_pixels: int = MAX_PIXELS,
) -> Iterator[torch.Tensor]:
    """Batches of transformed images from the shards of ``wds:PATTERN``; ``log`` records used,
    converted and skipped samples as for a folder."""
    log = log if log is not None else FolderLog()

    def entries() -> Iterator[tuple[str, Callable[[], tuple[Image.Image, str | None]]]]:
        for sample in iter_samples(shard_paths(images)):
            if limit is not None and len(log.used) >= limit:
                return
            base = f"{Path(sample['__url__']).name}/{sample['__key__']}"
            members = [k for k in sample if not k.startswith("__")]
            image_keys = [k for k in members if _suffix(k) in IMAGE_SUFFIXES]
            if not image_keys:
                listed = ", ".join(sorted(members)) or "nothing"
                log.skipped[base] = f"no image member in the sample (has {listed})"
                continue
            name, data = f"{base}.{image_keys[0]}", sample[image_keys[0]]
            yield name, lambda data=data, name=name: decode_bytes(data, name, max_pixels)

    yield from decoded_batches(entries(), transform, batch_size, log, str(images))


def count_samples(paths: list[Path]) -> int:
    """How many samples the shards hold, from their tar headers (no image is decoded)."""
    import tarfile

    from webdataset.tariterators import base_plus_ext

    keys = 0
    for path in paths:
        try:
            with tarfile.open(path) as tar:
                names = [m.name for m in tar.getmembers() if m.isfile()]
        except (tarfile.TarError, OSError) as e:
            raise InputError(f"shard {str(path)!r} is not a readable tar file ({e})") from None
        keys += len({base_plus_ext(n)[0] for n in names} - {None})
    return keys


def wds_images(
    model: Any,
    images: str | Path,
    batch_size: int = 32,
    limit: int | None = None,
    keep: int = 8,
    max_pixels: int = MAX_PIXELS,
) -> ImageSource:
    """Every readable image of the shards ``wds:PATTERN`` names, as an image source for ``model``;
    missing shards, or a pattern that is not local files, raise :class:`InputError` here."""
    paths = shard_paths(images)
    n = count_samples(paths)
    log = FolderLog()

    def batches() -> Iterator[torch.Tensor]:
        for record in (log.used, log.converted, log.skipped):  # a fresh record per pass
            record.clear()
        yield from iter_wds(images, model.transform, batch_size, limit, log, max_pixels)

    pattern = str(images)[len(PREFIX) :]
    desc = {
        "source": "webdataset",
        "description": f"the webdataset shards {pattern} ({len(paths)} shards)",
        "path": pattern,
        "n_shards": len(paths),  # the pattern names them; a list of 10k paths would not help
        "synthetic": False,
        "max_pixels": max_pixels,
    }
    return ImageSource(model, batches, desc, min(n, limit) if limit else n, keep, log)
