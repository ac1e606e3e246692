"""NACLIP (Hajimiri et al., WACV 2025, arXiv 2404.08181; code ``sinahmr/NACLIP``,
``clip/model.py`` ``custom_attn`` with ``arch='reduced'``, ``attn_strategy='naclip'``,
``gaussian_std=5``): the last block keeps only ``out_proj(softmax(k k^T s + omega) v)``, where
``omega`` adds ``exp(-d^2 / (2 std^2))`` for patches at grid distance ``d`` and nothing for
prefix tokens ([CLS], registers). No residual, no FFN. PAMR refinement is a segmentation
post-process, not part of the model edit."""

from __future__ import annotations

import torch

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.fix.blocks import BlockParts
from vitreg.fix.last_block import LastBlockFix

GAUSSIAN_STD = 5.0  # the official default (naclip.py, test_all.sh "reduced naclip 5")


def neighbourhood(layout: TokenLayout, std: float) -> torch.Tensor:
    """``[N, N]`` additive attention bias: a Gaussian of the patch-grid distance between patches,
    zero on every row and column of a prefix token."""
    h, w = layout.grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], dim=-1).float()
    d2 = ((pos[:, None] - pos[None]) ** 2).sum(-1)
    out = torch.zeros(layout.n_tokens, layout.n_tokens)
    p = layout.patches
    out[p, p] = torch.exp(-d2 / (2 * std**2))
    return out


class NACLIP(LastBlockFix):
    """Neighbour-aware k-k attention, residual and FFN dropped, in the last block."""

    name = "naclip"
    source = "Hajimiri et al. 2025 (WACV), sinahmr/NACLIP"
    residual = False
    ffn = False

    def __init__(self, gaussian_std: float = GAUSSIAN_STD) -> None:
        if not gaussian_std > 0:
            raise InputError(f"gaussian_std must be positive, got {gaussian_std}")
        self.gaussian_std = float(gaussian_std)
        self._cache: dict[TokenLayout, torch.Tensor] = {}

    def settings(self) -> dict[str, float]:
        return {"gaussian_std": self.gaussian_std}

    def weights(
        self, q: torch.Tensor, k: torch.Tensor, parts: BlockParts, layout: TokenLayout
    ) -> torch.Tensor:
        if layout not in self._cache:
            self._cache[layout] = neighbourhood(layout, self.gaussian_std)
        omega = self._cache[layout].to(k)
        return torch.softmax((k @ k.transpose(-2, -1)) * parts.scale + omega, dim=-1)
