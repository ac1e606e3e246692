"""SCLIP (Wang et al., ECCV 2024, arXiv 2312.01597; code ``wangf3014/SCLIP``, ``clip/model.py``
``custom_attn(csa=True)``): correlative self-attention ``softmax(q q^T s) + softmax(k k^T s)``
in the last block, whose residual and FFN are kept."""

from __future__ import annotations

import torch

from vitreg.core.layout import TokenLayout
from vitreg.fix.blocks import BlockParts
from vitreg.fix.last_block import LastBlockFix, self_softmax


class SCLIP(LastBlockFix):
    """Correlative self-attention (q-q plus k-k) in the last block."""

    name = "sclip"
    source = "Wang et al. 2024 (ECCV), wangf3014/SCLIP"
    residual = True
    ffn = True

    def weights(
        self, q: torch.Tensor, k: torch.Tensor, parts: BlockParts, layout: TokenLayout
    ) -> torch.Tensor:
        return self_softmax(q, parts.scale) + self_softmax(k, parts.scale)
