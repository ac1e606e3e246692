"""Pixel-adaptive mask refinement (PAMR; Araslanov & Roth, CVPR'20), the optional last step of
SCLIP's and NACLIP's segmentation (``pamr_steps``, ``pamr_stride``): each pixel's class scores
are replaced, ``steps`` times, by a weighted mean of its 8 neighbours at every dilation, the
weights a softmax over those neighbours of ``-mean_c |I_c(p) - I_c(n)| / (0.1 std_c(p))``, where
``std_c(p)`` is the (unbiased) spread of channel ``c`` over the pixel and all its neighbours
(all dilations together). Borders repeat the edge pixel. The weights depend on the image only,
so scores flow along regions of similar colour and stop at edges.

Published settings: NACLIP's ``--pamr on`` (its 8-benchmark table) is 10 steps at dilations
(8, 16), also SCLIP's default dilations; NACLIP's figures use 50 steps at 1, 2, 4, 8, 12, 24
(``sinahmr/NACLIP`` @ ``0cac3a6``: ``naclip.py``, ``eval.py``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from vitreg.errors import InputError

STEPS = 10
DILATIONS = (8, 16)
FIGURE_DILATIONS = (1, 2, 4, 8, 12, 24)


def _shifted(x: Tensor, dilations: Sequence[int], centre: bool) -> Iterator[Tensor]:
    """``x`` [B, C, H, W] seen from each 3x3 neighbour at each dilation (row-major, the centre
    only when ``centre``), edges replicated."""
    h, w = x.shape[-2:]
    for d in dilations:
        padded = F.pad(x, (d, d, d, d), mode="replicate")
        for dy in (-d, 0, d):
            for dx in (-d, 0, d):
                if dy == dx == 0 and not centre:
                    continue
                yield padded[..., d + dy : d + dy + h, d + dx : d + dx + w]


def affinity(image: Tensor, dilations: Sequence[int] = DILATIONS) -> Tensor:
    """``[B, 8 * len(dilations), H, W]`` neighbour weights of every pixel (softmax over them)."""
    spread = torch.stack(list(_shifted(image, dilations, True)), 2).std(2)  # [B, C, H, W]
    scale = 1e-8 + 0.1 * spread
    logits = [-((n - image).abs() / scale).mean(1) for n in _shifted(image, dilations, False)]
    return torch.softmax(torch.stack(logits, 1), 1)


def pamr(
    image: Tensor, scores: Tensor, steps: int = STEPS, dilations: Sequence[int] = DILATIONS
) -> Tensor:
    """``scores`` [B, K, H, W] refined along ``image`` [B, C, H, W] (same size) for ``steps``."""
    if image.shape[-2:] != scores.shape[-2:] or image.shape[0] != scores.shape[0]:
        raise InputError(
            f"PAMR needs the image and the scores at one size; got {tuple(image.shape)} and "
            f"{tuple(scores.shape)}"
        )
    if steps < 0 or not dilations or min(dilations) < 1:
        raise InputError(f"PAMR takes steps >= 0 and dilations >= 1, not {steps}, {dilations}")
    weights = affinity(image.float(), dilations)
    out = scores.float()
    for _ in range(steps):
        # layout: pixel maps [B, K, H, W]; j picks a neighbour's affinity, not a token
        out = sum(n * weights[:, j : j + 1] for j, n in enumerate(_shifted(out, dilations, False)))
    return out.to(scores.dtype)
