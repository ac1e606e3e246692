"""Last-block fixes: the training-free CLIP segmentation edits that rebuild the final block from
its own weights with another attention, and with or without its residual and FFN."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch

from vitreg.core.layout import TokenLayout
from vitreg.fix.base import Fix
from vitreg.fix.blocks import BlockParts, block_parts, mix, replace_block
from vitreg.hooks.sites import Handle
from vitreg.models.model import Model
from vitreg.results.fix import LastBlockDescription


class LastBlockFix(Fix):
    """``out = [x +] attn_out(A v) [+ mlp(ln2(.))]`` in the last block, ``A`` from :meth:`weights`."""

    name: ClassVar[str]
    source: ClassVar[str]  # paper and official code the defaults come from
    residual: ClassVar[bool]
    ffn: ClassVar[bool]

    @abstractmethod
    def weights(
        self, q: torch.Tensor, k: torch.Tensor, parts: BlockParts, layout: TokenLayout
    ) -> torch.Tensor:
        """Attention weights ``[B, H, N, N]`` from q and k ``[B, H, N, D]``."""

    def settings(self) -> dict[str, float]:
        """The method's own parameters (for the report)."""
        return {}

    def describe(self) -> LastBlockDescription:
        return LastBlockDescription(
            name=type(self).__name__,
            method=self.name,
            source=self.source,
            block="last",
            residual=self.residual,
            ffn=self.ffn,
            **self.settings(),
        )

    def block(self, x: torch.Tensor, parts: BlockParts, layout: TokenLayout) -> torch.Tensor:
        """The rebuilt block on its input ``x`` ``[B, N, C]``."""
        q, k, v = parts.qkv(parts.ln1(x))
        out = parts.attn_out(mix(self.weights(q, k, parts, layout), v))
        if self.residual:
            out = x + out
        if self.ffn:
            out = out + parts.mlp(parts.ln2(out))
        return out

    def apply(self, model: Model) -> Handle:
        layer = model.n_layers - 1
        parts = block_parts(model, layer)
        return replace_block(model, layer, lambda x, layout: self.block(x, parts, layout))


def self_softmax(t: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(t t^T * scale)`` over the last axis (q-q or k-k attention)."""
    return torch.softmax((t @ t.transpose(-2, -1)) * scale, dim=-1)
