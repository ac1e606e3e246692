"""ClearCLIP (Lan et al., ECCV 2024, arXiv 2407.12442; code ``mc-lan/ClearCLIP``,
``open_clip/transformer.py`` ``custom_attn`` with ``model_type='ClearCLIP'`` and
``ignore_residual=True``): the last block keeps only ``out_proj(softmax(q q^T s) v)`` -- no
residual, no FFN (self-self attention on the queries)."""

from __future__ import annotations

import torch

from vitreg.core.layout import TokenLayout
from vitreg.fix.blocks import BlockParts
from vitreg.fix.last_block import LastBlockFix, self_softmax


class ClearCLIP(LastBlockFix):
    """q-q attention, residual and FFN dropped, in the last block."""

    name = "clearclip"
    source = "Lan et al. 2024 (ECCV), mc-lan/ClearCLIP"
    residual = False
    ffn = False

    def weights(
        self, q: torch.Tensor, k: torch.Tensor, parts: BlockParts, layout: TokenLayout
    ) -> torch.Tensor:
        return self_softmax(q, parts.scale)
