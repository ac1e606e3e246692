"""Synthetic natural-looking images with flat background regions of known extent.

Textured content (octaves of value noise, fine grain, striped and noisy shapes with hard edges)
covers most of each image; smooth blobs of one random colour (a faint gradient, no texture) cover
``flat_fraction`` of it. The flat masks are returned, so tests know where low-information patches
are -- the patches on which planted register neurons fire (the planted fixtures of :mod:`vitreg.testing.planted`).
Generation is vectorised torch and deterministic by seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from PIL import Image

from vitreg.errors import InputError


@dataclass(frozen=True)
class SyntheticImages:
    """Images ``[n, 3, size, size]`` in [0, 1] and their flat-region masks ``[n, size, size]``."""

    images: torch.Tensor
    flat_masks: torch.Tensor
    flat_fraction: float
    seed: int

    def patch_coverage(self, patch_size: int) -> torch.Tensor:
        """Fraction of each ``patch_size`` patch that is flat, ``[n, h, w]`` (1.0 = fully flat)."""
        # layout: image channels, not tokens
        return F.avg_pool2d(self.flat_masks[:, None].float(), patch_size)[:, 0]

    def to_pil(self) -> list[Image.Image]:
        return to_pil(self.images)


def _value_noise(g: torch.Generator, n: int, c: int, size: int, cells: int) -> torch.Tensor:
    """Smooth noise in [0, 1]: a random ``cells`` x ``cells`` lattice upsampled bicubically."""
    lattice = torch.rand(n, c, cells + 1, cells + 1, generator=g)
    return F.interpolate(lattice, size=(size, size), mode="bicubic", align_corners=True)


def _texture(g: torch.Generator, n: int, size: int, grain: torch.Tensor) -> torch.Tensor:
    """Textured content: a colour field plus octaves of noise and per-pixel grain."""
    base = 0.3 + 0.4 * _value_noise(g, n, 3, size, 2) + grain
    octaves = [c for c in (4, 8, 16, 32, 64) if c <= size // 2]
    for i, cells in enumerate(octaves):
        amp = 0.14 / (1.4**i)
        noise = 2 * _value_noise(g, n, 4, size, cells) - 1  # luminance + a little chroma
        # layout: image channels (luminance, chroma), not tokens
        base = base + amp * (0.8 * noise[:, :1] + 0.3 * noise[:, 1:])
    return base


def _shapes(g: torch.Generator, img: torch.Tensor, grain: torch.Tensor, k: int) -> torch.Tensor:
    """Paint ``k`` rotated ellipses/rectangles per image with striped, grainy fills."""
    n, _, size, _ = img.shape
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    for _ in range(k):
        cx, cy = torch.rand(2, n, 1, 1, generator=g)
        ax, ay = (0.06 + 0.2 * torch.rand(2, n, 1, 1, generator=g)).unbind(0)
        theta = math.pi * torch.rand(n, 1, 1, generator=g)
        dx, dy = xx - cx, yy - cy
        u = dx * theta.cos() + dy * theta.sin()
        v = -dx * theta.sin() + dy * theta.cos()
        ellipse = (u / ax) ** 2 + (v / ay) ** 2 < 1
        rect = (u.abs() < ax) & (v.abs() < ay)
        is_rect = torch.rand(n, 1, 1, generator=g) < 0.5
        mask = torch.where(is_rect, rect, ellipse)[:, None]
        colour = 0.2 + 0.6 * torch.rand(n, 3, 1, 1, generator=g)
        freq = 20 + 60 * torch.rand(n, 1, 1, generator=g)
        stripes = 0.12 * torch.sin(freq * u + 10 * v)[:, None]
        img = torch.where(mask, colour + stripes + grain, img)
    return img


def _flat_regions(
    g: torch.Generator, n: int, size: int, fraction: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks covering ``fraction`` of each image (smooth blobs) and their flat colour fields."""
    # layout: image channels, not tokens
    field = _value_noise(g, n, 1, size, 3)[:, 0]
    q = torch.quantile(field.flatten(1), fraction, dim=1)
    masks = field < q[:, None, None]
    colour = 0.15 + 0.7 * torch.rand(n, 3, 1, 1, generator=g)
    coords = torch.linspace(-0.5, 0.5, size)
    direction = torch.randn(n, 2, 1, 1, generator=g)
    ramp = (
        direction[:, :1] * coords[None, None, :, None]
        + direction[:, 1:] * coords[None, None, None, :]  # layout: ramp directions (y, x)
    )
    return masks, colour + 0.03 * ramp


def make_synthetic(
    n: int, size: int = 224, seed: int = 0, flat_fraction: float = 0.3, n_shapes: int = 6
) -> SyntheticImages:
    """``n`` textured images with flat regions covering ``flat_fraction`` of each, plus masks."""
    if n < 1 or size < 8:
        raise InputError(f"need n >= 1 images of size >= 8, got n={n}, size={size}")
    if not 0.0 <= flat_fraction < 1.0:
        raise InputError(f"flat_fraction must be in [0, 1), got {flat_fraction}")
    g = torch.Generator().manual_seed(seed)
    grain = 0.25 * (torch.rand(n, 1, size, size, generator=g) - 0.5)
    img = _shapes(g, _texture(g, n, size, grain), grain, n_shapes)
    masks, flat = _flat_regions(g, n, size, flat_fraction)
    if flat_fraction == 0.0:
        masks = torch.zeros_like(masks)
    img = torch.where(masks[:, None], flat, img).clamp(0.0, 1.0)
    return SyntheticImages(img, masks, flat_fraction, seed)


def synthetic_images(
    n: int, size: int = 224, seed: int = 0, flat_fraction: float = 0.3
) -> torch.Tensor:
    """``n`` synthetic images ``[n, 3, size, size]`` in [0, 1]; masks via :func:`make_synthetic`."""
    return make_synthetic(n, size, seed, flat_fraction).images


def to_pil(images: torch.Tensor) -> list[Image.Image]:
    """RGB PIL images from a ``[n, 3, H, W]`` tensor in [0, 1]."""
    arr = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(a) for a in arr]


def synthetic_pil(
    n: int, size: int = 224, seed: int = 0, flat_fraction: float = 0.3
) -> list[Image.Image]:
    """The images of :func:`synthetic_images` as RGB PIL images (for transform pipelines)."""
    return to_pil(synthetic_images(n, size, seed, flat_fraction))
