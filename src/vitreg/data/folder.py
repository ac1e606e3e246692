"""Image folders for analyses: every readable image is used, every unreadable file is counted.

Files that are not images or cannot be decoded are skipped and listed with the reason.
Grayscale, palette, RGBA/LA and 16-bit images are converted to 8-bit RGB (as torchvision's
ImageFolder does for ImageNet's grayscale JPEGs) and listed as converted, so a report can say
exactly what the model saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from vitreg.errors import InputError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm"}


@dataclass
class FolderLog:
    """What happened to each file: used, converted (with the original mode) or skipped (why)."""

    used: list[str] = field(default_factory=list)
    converted: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "n_used": len(self.used),
            "converted": dict(self.converted),
            "skipped": dict(self.skipped),
        }


def list_images(directory: str | Path) -> list[Path]:
    """All files under ``directory`` (recursively, sorted); an empty or missing folder is an error."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise InputError(f"image folder {str(root)!r} does not exist or is not a directory")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
        raise InputError(f"image folder {str(root)!r} is empty; put .jpg/.png images in it")
    return files


def to_rgb(img: Image.Image) -> tuple[Image.Image, str | None]:
    """8-bit RGB version of ``img`` and the original mode if it had to be converted."""
    if img.mode == "RGB":
        return img, None
    mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr / top * 255.0, 0, 255).astype(np.uint8), mode="L")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, rgba)
    return img.convert("RGB"), mode


def load_image(path: Path) -> tuple[Image.Image, str | None]:
    """Decode one file fully (so truncated files fail here, not later) and convert it to RGB."""
    with Image.open(path) as img:
        img.load()
        return to_rgb(img)


def iter_folder(
    directory: str | Path,
    transform: Callable[[Image.Image], torch.Tensor],
    batch_size: int = 32,
    limit: int | None = None,
    log: FolderLog | None = None,
) -> Iterator[torch.Tensor]:
    """Batches of transformed images from a folder; ``log`` records used/converted/skipped files."""
    log = log if log is not None else FolderLog()
    batch: list[torch.Tensor] = []
    for path in list_images(directory):
        if limit is not None and len(log.used) >= limit:
            break
        name = str(path)
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            log.skipped[name] = f"not an image file ({path.suffix or 'no suffix'})"
            continue
        try:
            img, mode = load_image(path)
        except (UnidentifiedImageError, OSError, ValueError) as e:
            log.skipped[name] = f"could not be decoded: {type(e).__name__}: {e}"
            continue
        if mode is not None:
            log.converted[name] = mode
        log.used.append(name)
        batch.append(transform(img))
        if len(batch) == batch_size:
            yield torch.stack(batch)
            batch = []
    if batch:
        yield torch.stack(batch)
    if not log.used:
        raise InputError(
            f"no readable image in {str(directory)!r}; skipped: "
            + "; ".join(f"{Path(k).name}: {v}" for k, v in list(log.skipped.items())[:5])
        )
