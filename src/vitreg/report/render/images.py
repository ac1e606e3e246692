"""Images as report.html shows them: figures scaled to the page's column and both figures and
the slider's input images encoded as lossy WebP, so the page stays small (about 1.3 MB for the
demo) while figures/ keeps the full-resolution PNGs for papers. The encoding is deterministic:
the same pixels give the same bytes."""

from __future__ import annotations

import base64
import io
from typing import Any

DISPLAY_WIDTH = 1100  # px: the width of report.html's column (main's max-width)
QUALITY = 80  # WebP quality: plots and maps stay sharp at this width
REDUCING_GAP = 2.0  # shrink by whole factors first, then Lanczos: half the time, same look


def display_uri(png: bytes, width: int = DISPLAY_WIDTH) -> str:
    """A figure's PNG as the page shows it: at most ``width`` pixels wide, as a data URI."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as src:
        img = src.convert("RGB")
    if img.width > width:
        size = (width, round(img.height * width / img.width))
        img = img.resize(size, Image.Resampling.LANCZOS, reducing_gap=REDUCING_GAP)
    return image_uri(img)


def image_uri(img: Any) -> str:
    """A PIL image as a WebP data URI."""
    buf = io.BytesIO()
    img.save(
        buf, format="WEBP", quality=QUALITY, method=0
    )  # the fastest: 0.5x the time, +20% bytes
    return "data:image/webp;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
