"""Image augmentations on [3, H, W] tensors in [0, 1], drawing only from an explicit generator.

Every random choice comes from the ``torch.Generator`` passed in, so an augmented view is a
pure function of (seed, step, sample position): the same on any rank and after a resume.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

LUMA = (0.299, 0.587, 0.114)


def uniform(g: torch.Generator, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo + (hi - lo) * torch.rand((), generator=g).item()


def randint(g: torch.Generator, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi)``."""
    return int(torch.randint(lo, hi, (1,), generator=g).item())


def to_tensor(image: object) -> torch.Tensor:
    """A PIL image, HWC uint8 array or CHW tensor as a float [3, H, W] tensor in [0, 1]."""
    if isinstance(image, torch.Tensor):
        t = image.float() / 255 if image.dtype == torch.uint8 else image.float()
    else:
        rgb = image.convert("RGB") if hasattr(image, "convert") else image
        t = torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1).float() / 255
    if t.ndim != 3 or t.shape[0] != 3:
        raise ValueError(f"expected an RGB image, got a tensor of shape {tuple(t.shape)}")
    return t


def random_resized_crop(
    img: torch.Tensor,
    size: int,
    scale: tuple[float, float],
    g: torch.Generator,
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> torch.Tensor:
    """A crop of random area fraction and aspect ratio, resized to ``size`` x ``size``."""
    _, h_img, w_img = img.shape
    area = h_img * w_img
    h, w, top, left = h_img, w_img, 0, 0
    for _ in range(10):
        a = area * uniform(g, *scale)
        r = math.exp(uniform(g, math.log(ratio[0]), math.log(ratio[1])))
        cw, ch = round(math.sqrt(a * r)), round(math.sqrt(a / r))
        if 0 < cw <= w_img and 0 < ch <= h_img:
            h, w = ch, cw
            top, left = randint(g, 0, h_img - h + 1), randint(g, 0, w_img - w + 1)
            break
    else:  # fall back to the largest centred square
        h = w = min(h_img, w_img)
        top, left = (h_img - h) // 2, (w_img - w) // 2
    crop = img[None, :, top : top + h, left : left + w]
    out = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True)
    return out[0].clamp(0, 1)


def hflip(img: torch.Tensor, g: torch.Generator, p: float = 0.5) -> torch.Tensor:
    return img.flip(-1) if uniform(g) < p else img


def luma(img: torch.Tensor) -> torch.Tensor:
    """Grey level [1, H, W] (ITU-R 601 weights)."""
    w = torch.tensor(LUMA, dtype=img.dtype).view(3, 1, 1)
    return (img * w).sum(0, keepdim=True)


def grayscale(img: torch.Tensor) -> torch.Tensor:
    return luma(img).expand(3, -1, -1).clone()


def solarize(img: torch.Tensor, threshold: float = 0.5) -> torch.Tensor:
    return torch.where(img >= threshold, 1 - img, img)


def _blur_matrix(n: int, sigma: float, dtype: torch.dtype) -> torch.Tensor:
    """[n, n] matrix applying a 1-D Gaussian (radius 3 sigma) with reflect padding."""
    radius = max(1, min(math.ceil(3 * sigma), n - 1))
    offsets = torch.arange(-radius, radius + 1)
    k = torch.exp(-(offsets.to(dtype) ** 2) / (2 * sigma**2))
    idx = (torch.arange(n)[:, None] + offsets[None]).abs()
    idx = torch.where(idx > n - 1, 2 * (n - 1) - idx, idx)
    return torch.zeros(n, n, dtype=dtype).scatter_add_(1, idx, (k / k.sum()).expand(n, -1))


def gaussian_blur(img: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur as two small matrix products (fast for any sigma and size)."""
    _, h, w = img.shape
    if min(h, w) < 2:
        return img
    return _blur_matrix(h, sigma, img.dtype) @ img @ _blur_matrix(w, sigma, img.dtype).T


def color_jitter(
    img: torch.Tensor,
    g: torch.Generator,
    brightness: float,
    contrast: float,
    saturation: float,
    hue: float = 0.0,
) -> torch.Tensor:
    """Random brightness, contrast, saturation factors in [1-j, 1+j] and a hue rotation in [-h, h]."""
    img = (img * uniform(g, 1 - brightness, 1 + brightness)).clamp(0, 1)
    mean = luma(img).mean()
    img = ((img - mean) * uniform(g, 1 - contrast, 1 + contrast) + mean).clamp(0, 1)
    grey = luma(img)
    img = ((img - grey) * uniform(g, 1 - saturation, 1 + saturation) + grey).clamp(0, 1)
    if hue > 0:
        img = rotate_hue(img, uniform(g, -hue, hue))
    return img


def rotate_hue(img: torch.Tensor, shift: float) -> torch.Tensor:
    """Rotate the chroma plane (YIQ) by ``shift`` turns."""
    to_yiq = torch.tensor(
        [[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], dtype=img.dtype
    )
    c, s = math.cos(2 * math.pi * shift), math.sin(2 * math.pi * shift)
    rot = torch.tensor([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=img.dtype)
    m = torch.linalg.inv(to_yiq) @ rot @ to_yiq
    return (m @ img.reshape(3, -1)).view_as(img).clamp(0, 1)


def normalize(img: torch.Tensor, mean: tuple, std: tuple) -> torch.Tensor:
    return (img - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)


def three_augment(img: torch.Tensor, size: int, g: torch.Generator, jitter: float = 0.3):
    """DeiT-III "3-Augment": crop + flip, one of grayscale / solarize / blur, colour jitter."""
    img = hflip(random_resized_crop(img, size, (0.08, 1.0), g), g)
    choice = randint(g, 0, 3)
    if choice == 0:
        img = grayscale(img)
    elif choice == 1:
        img = solarize(img)
    else:
        img = gaussian_blur(img, uniform(g, 0.1, 2.0))
    return color_jitter(img, g, jitter, jitter, jitter)


def dino_view(
    img: torch.Tensor,
    size: int,
    scale: tuple[float, float],
    g: torch.Generator,
    blur_p: float,
    solarize_p: float = 0.0,
) -> torch.Tensor:
    """One DINO crop: crop + flip, jitter (p 0.8), grayscale (p 0.2), blur, solarize."""
    img = hflip(random_resized_crop(img, size, scale, g), g)
    if uniform(g) < 0.8:
        img = color_jitter(img, g, 0.4, 0.4, 0.2, 0.1)
    if uniform(g) < 0.2:
        img = grayscale(img)
    if uniform(g) < blur_p:
        img = gaussian_blur(img, uniform(g, 0.1, 2.0))
    if uniform(g) < solarize_p:
        img = solarize(img)
    return img
