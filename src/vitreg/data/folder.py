"""Image folders for analyses: every entry the walk meets is used, converted or listed as skipped.

Files that are not images or cannot be decoded are skipped and listed with the reason; so are
hidden files and folders, dangling links, symlink loops, links to folders (not followed), links
that lead outside the folder (never read), and FIFOs, sockets and devices (never opened:
reading a FIFO would block). Grayscale, palette, RGBA/LA and 16-bit images are converted to
8-bit RGB (as torchvision's ImageFolder does for ImageNet's grayscale JPEGs); 32-bit integer
and float images are scaled to 8 bits by their range. Every conversion is listed (with the
scaling used), so a report can say exactly what the model saw.

Pixel budget: an image may hold at most ``max_pixels`` pixels (default :data:`MAX_PIXELS`).
The size is read from the header (``Image.open`` is lazy) before any pixel is decoded, so a
small file declaring a huge image (a decompression bomb) is skipped with the size it declares
instead of being decoded. Pillow's own bomb guard (``Image.MAX_IMAGE_PIXELS``) is left as it
is: its warning is silenced inside the reader (the budget is the check), and images it refuses
are skipped like any other over-budget image.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitreg.core.containment import outside
from vitreg.errors import InputError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm"}

MAX_PIXELS = 50_000_000
"""Default pixel budget (width x height) per image: 50 M pixels decode to 150 MB of 8-bit RGB
(200 MB as float), comfortably inside a small machine's memory; larger images are skipped."""

# What Pillow raises on hostile or damaged files (UnidentifiedImageError is an OSError)
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    IndexError,
    TypeError,
    KeyError,
    ZeroDivisionError,
    MemoryError,
    Image.DecompressionBombError,
)

INT_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")
WIDE_MODES = (*INT_MODES, "F")


class PixelBudgetError(InputError):
    """An image declares more pixels than the budget (found from its header, nothing decoded)."""

    def __init__(self, message: str, pixels: int, budget: int) -> None:
        super().__init__(message)
        self.pixels = pixels
        self.budget = budget


class UnusableImage(InputError):
    """An image that decodes but has no faithful 8-bit RGB version (e.g. NaN or constant floats)."""


@dataclass
class FolderLog:
    """What happened to each file: used, converted (with the original mode) or skipped (why)."""

    used: list[str] = field(default_factory=list)
    converted: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- the walk
@dataclass(frozen=True)
class WalkSkip:
    """An entry of a folder that is not read: ``reason`` to count, ``message`` to list."""

    path: Path
    reason: str
    message: str


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a file or folder")


def walk_folder(directory: str | Path) -> tuple[list[Path], list[WalkSkip]]:
    """Regular files under ``directory`` (recursively, in sorted path order) and every other
    entry met, with the reason it is not read.

    Links to files are followed; links to folders are not (listed), nor are dangling links and
    symlink loops. FIFOs, sockets and devices are found with ``stat`` and never opened. Names
    starting with ``.`` are hidden: listed, not read (a hidden folder is not searched).
    """
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise InputError(f"image folder {str(root)!r} does not exist or is not a directory")
    files: list[Path] = []
    skipped: list[WalkSkip] = []

    def skip(path: Path, reason: str, message: str) -> None:
        skipped.append(WalkSkip(path, reason, message))

    def visit(folder: Path) -> None:
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            skip(folder, "unreadable_folder", f"folder could not be listed ({_os_error(e)})")
            return
        for entry in entries:
            path = Path(entry.path)
            link = entry.is_symlink()
            if entry.name.startswith("."):
                what = "folder" if entry.is_dir(follow_symlinks=False) else "file"
                skip(path, "hidden", f"hidden {what} (name starts with '.'); not read")
                continue
            try:
                st = os.stat(path)  # follows links
            except OSError as e:
                if link and e.errno == errno.ELOOP:
                    skip(path, "symlink_loop", "symlink loop; not followed")
                elif link:
                    skip(path, "dangling_symlink", f"dangling symlink to {_target(path)}")
                else:
                    skip(path, "unreadable_entry", f"could not be examined ({_os_error(e)})")
                continue
            if link and outside(root, path) is not None:  # one containment rule
                skip(
                    path,
                    "link_outside",
                    f"symlink to {_target(path)}, outside the folder; not read",
                )
                continue
            via = f" (a symlink to {_target(path)})" if link else ""
            if stat.S_ISDIR(st.st_mode):
                if link:
                    skip(
                        path,
                        "symlink_to_folder",
                        f"symlink to the folder {_target(path)}; not followed",
                    )
                else:
                    visit(path)
            elif stat.S_ISREG(st.st_mode):
                files.append(path)
            else:
                skip(path, "not_a_regular_file", f"not a regular file: {_kind(st.st_mode)}{via}")

    visit(root)
    return files, skipped


def _target(path: Path) -> str:
    try:
        return repr(os.readlink(path))
    except OSError:
        return "an unreadable target"


def _os_error(e: OSError) -> str:
    return f"{type(e).__name__}: {e.strerror or e}"


def list_images(directory: str | Path) -> list[Path]:
    """All regular files under ``directory`` (recursively, sorted; see :func:`walk_folder`); an
    empty or missing folder is an error."""
    files, skipped = walk_folder(directory)
    if not files:
        root = str(Path(directory).expanduser())
        if not skipped:
            raise InputError(f"image folder {root!r} is empty; put .jpg/.png images in it")
        listed = "; ".join(f"{s.path.name}: {s.message}" for s in skipped[:5])
        raise InputError(f"image folder {root!r} holds no file that can be read ({listed})")
    return files


# ---------------------------------------------------------------- one image
def _declared_size(path: Path) -> tuple[int, int] | None:
    """Width and height a file's header declares, read by the format plugins directly (for files
    ``Image.open`` refuses as decompression bombs before it returns the size)."""
    with open(path, "rb") as fp:
        prefix = fp.read(16)
        for fmt in list(Image.ID):
            factory, accept = Image.OPEN[fmt]
            found = accept(prefix) if accept is not None else True
            if not found or isinstance(found, str):  # a str is Pillow's "maybe, but" note
                continue
            fp.seek(0)
            try:
                im = factory(fp, str(path))
            except Exception:  # any plugin failure: try the next format
                continue
            return im.size
    return None


def _over_budget(size: tuple[int, int] | None, pixels: int, budget: int, pil: bool):
    if pixels < 0:  # Pillow refused it and no plugin would say its size
        return PixelBudgetError("refused by Pillow as a decompression bomb", pixels, budget)
    declared = f"{size[0]}×{size[1]} = {pixels:,}" if size else f"{pixels:,}"
    message = f"declares {declared} pixels, above the budget of {budget:,}"
    if pil and pixels <= budget:  # within the budget, but Pillow's own guard refuses it
        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        message = (
            f"declares {declared} pixels, above Pillow's decompression-bomb limit of {limit:,} "
            "(raise PIL.Image.MAX_IMAGE_PIXELS to read it)"
        )
    return PixelBudgetError(message, pixels, budget)


@contextmanager
def open_image(path: str | Path, max_pixels: int = MAX_PIXELS) -> Iterator[Image.Image]:
    """``Image.open(path)`` (lazy: header only) after checking that ``path`` is a regular file
    and that the size its header declares is within ``max_pixels``; raises
    :class:`PixelBudgetError` otherwise. Pillow's decompression-bomb warning is silenced inside
    (the budget is the check) and its bomb error becomes a :class:`PixelBudgetError`."""
    path = Path(path)
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise UnusableImage(f"not a regular file: {_kind(mode)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            img = Image.open(path)
        except Image.DecompressionBombError as e:
            size = _declared_size(path)
            found = re.search(r"\((\d+) pixels\)", str(e))
            pixels = size[0] * size[1] if size else int(found.group(1)) if found else -1
            raise _over_budget(size, pixels, max_pixels, pil=True) from None
        with img:
            w, h = img.size
            if w * h > max_pixels:
                raise _over_budget((w, h), w * h, max_pixels, pil=False)
            yield img


def _scale_to_8bit(img: Image.Image) -> tuple[Image.Image, str]:
    """A 32-bit integer, 16-bit or float image as 8-bit ``L``, and the scaling used in words.

    Values are mapped from a range to 0..255: 0..1 for floats that lie in it, else 0..255 or
    0..65535 when the values fit them (8-bit data stored wide, 16-bit data), else the image's
    own min..max. NaN/infinite pixels, or a constant image with no range to use, are refused.
    """
    mode = img.mode
    raw = np.asarray(img)
    if raw.dtype.kind == "f":
        finite = np.isfinite(raw)
        if not finite.all():
            n_bad = int((~finite).sum())
            raise UnusableImage(f"{mode} image with {n_bad} NaN/infinite pixels of {raw.size}")
    lo, hi = float(raw.min()), float(raw.max())  # exact for 32-bit integers
    arr = raw.astype(np.float32)  # 8 bits out: float32 is precise enough, and half of float64
    if mode == "F" and 0 <= lo and hi <= 1:
        r0, r1 = 0.0, 1.0
    elif 0 <= lo and hi <= 255:
        r0, r1 = 0.0, 255.0
    elif 0 <= lo and hi <= 65535:
        r0, r1 = 0.0, 65535.0
    elif hi > lo:
        r0, r1 = lo, hi
    else:
        raise UnusableImage(f"{mode} image is constant ({_num(lo)}): no range to scale to 8 bits")
    out = np.clip((arr - r0) * (255.0 / (r1 - r0)) + 0.5, 0, 255).astype(np.uint8)
    note = f"{mode}, values {_num(lo)}..{_num(hi)} scaled {_num(r0)}..{_num(r1)} -> 0..255"
    return Image.fromarray(out), note


def _num(v: float) -> str:
    """Whole numbers in full (32-bit integer ranges), others to 6 significant digits."""
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:g}"


def to_rgb(img: Image.Image) -> tuple[Image.Image, str | None]:
    """8-bit RGB version of ``img`` and what was converted (``None`` if nothing): the original
    mode, plus the scaling for 16/32-bit and float images. Raises :class:`UnusableImage` when
    there is no faithful 8-bit version."""
    if img.mode == "RGB":
        return img, None
    note = img.mode
    if img.mode in WIDE_MODES:
        img, note = _scale_to_8bit(img)
    try:
        if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
            img.mode == "P" and "transparency" in img.info
        ):
            rgba = img.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            img = Image.alpha_composite(background, rgba)
        return img.convert("RGB"), note
    except ValueError as e:  # modes Pillow cannot convert (e.g. LAB, HSV)
        raise UnusableImage(f"mode {img.mode} cannot be converted to RGB ({e})") from None


def load_image(path: Path, max_pixels: int = MAX_PIXELS) -> tuple[Image.Image, str | None]:
    """Decode one file fully (so truncated files fail here, not later) and convert it to RGB.

    Raises :class:`PixelBudgetError` (before decoding) for images above ``max_pixels``,
    :class:`UnusableImage` for images with no faithful RGB version, and Pillow's errors
    (:data:`DECODE_ERRORS`) for files that cannot be decoded.
    """
    with open_image(path, max_pixels) as img:
        img.load()
        return to_rgb(img)


def skip_reason(e: BaseException) -> str:
    """The words a listing gives for a file :func:`load_image` refused."""
    if isinstance(e, (PixelBudgetError, UnusableImage)):
        return str(e)
    return f"could not be decoded: {type(e).__name__}: {e}"


def iter_folder(
    directory: str | Path,
    transform: Callable[[Image.Image], torch.Tensor],
    batch_size: int = 32,
    limit: int | None = None,
    log: FolderLog | None = None,
    max_pixels: int = MAX_PIXELS,
) -> Iterator[torch.Tensor]:
    """Batches of transformed images from a folder; ``log`` records used/converted/skipped files.

    Images above ``max_pixels`` (declared width x height) are skipped before decoding.
    """
    log = log if log is not None else FolderLog()
    files, walked = walk_folder(directory)
    for s in walked:
        log.skipped[str(s.path)] = s.message
    if not files and not walked:
        raise InputError(f"image folder {str(directory)!r} is empty; put .jpg/.png images in it")

    def entries() -> Iterator[tuple[str, Callable[[], tuple[Image.Image, str | None]]]]:
        for path in files:
            if limit is not None and len(log.used) >= limit:
                return
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                log.skipped[str(path)] = f"not an image file ({path.suffix or 'no suffix'})"
                continue
            yield str(path), lambda path=path: load_image(path, max_pixels)

    yield from decoded_batches(entries(), transform, batch_size, log, repr(str(directory)), True)


def decoded_batches(
    entries: Iterator[tuple[str, Callable[[], tuple[Image.Image, str | None]]]],
    transform: Callable[[Image.Image], torch.Tensor],
    batch_size: int,
    log: FolderLog,
    where: str,
    short_names: bool = False,
) -> Iterator[torch.Tensor]:
    """Batches of ``transform``ed images from ``(name, decode)`` entries (a folder's files, a
    shard's samples), undecodable ones skipped and conversions noted in ``log``; an error naming
    ``where`` when not one decodes."""
    batch: list[torch.Tensor] = []
    for name, decode in entries:
        try:
            img, note = decode()
        except DECODE_ERRORS as e:
            log.skipped[name] = skip_reason(e)
            continue
        if note is not None:
            log.converted[name] = note
        log.used.append(name)
        batch.append(transform(img))
        if len(batch) == batch_size:
            yield torch.stack(batch)
            batch = []
    if batch:
        yield torch.stack(batch)
    if not log.used:
        raise InputError(
            f"no readable image in {where}; skipped: "
            + "; ".join(
                f"{Path(k).name if short_names else k}: {v}"
                for k, v in list(log.skipped.items())[:5]
            )
        )
