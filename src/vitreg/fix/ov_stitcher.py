"""OV-Stitcher (Moon, Oh, Ro, arXiv 2604.08110; ``atw617/OV-Stitcher`` publishes no code yet):
sliding windows run every block but the last on their own; the final block then runs once over
the sub-window features stitched back into the whole image's grid, so it attends globally.

What each step implements (the paper's description; its formulas are not public as code):

1. every crop of the sliding window goes through blocks ``0..L-2`` as usual (the input of the
   final block, ``features(crop, stop_at_layer=-1)``);
2. stitching: a crop's patch tokens are placed at their patches' positions in the image's patch
   grid (offset ``round(top / patch)``); where crops overlap the tokens are averaged, as the
   sliding window averages logits; the prefix tokens ([CLS]) are the crops' mean;
3. the final block (the model's own, or a last-block fix's attention: ``final=NACLIP()``) runs
   once over the stitched sequence, then the model's final norm; the dense logits come from
   that one grid, upsampled to the image.

The fix acts where the open-vocabulary segmentation probe slides its window
(:func:`active_stitcher`); a single crop (an image no larger than the model's input) is the
plain forward with ``final`` applied.
"""

from __future__ import annotations

from collections.abc import Callable
from weakref import WeakKeyDictionary

import torch
from torch import nn

from vitreg.core.layout import TokenLayout
from vitreg.errors import UnsupportedModelError
from vitreg.fix.base import Fix
from vitreg.fix.blocks import BlockParts, block_parts
from vitreg.fix.last_block import LastBlockFix
from vitreg.hooks.sites import Handle
from vitreg.models.model import Model
from vitreg.results.fix import OvStitcherDescription

_ACTIVE: WeakKeyDictionary[Model, OVStitcher] = WeakKeyDictionary()


def active_stitcher(model: Model) -> OVStitcher | None:
    """The OV-Stitcher applied to ``model`` now, if any (the sliding window asks)."""
    return _ACTIVE.get(model)


def final_norm(model: Model) -> Callable[[torch.Tensor], torch.Tensor]:
    """The norm ``model.features`` applies after the last block (none where it returns the last
    block's output, as HF towers' ``last_hidden_state``)."""
    family = model.family
    if family == "open_clip-vit":
        return model.module.ln_post if model.adapter.ln_post_on_tokens else nn.Identity()
    if family in ("hf-clip", "hf-siglip"):
        return nn.Identity()
    if family == "timm-vit":
        return model.module.norm
    raise UnsupportedModelError(f"OV-Stitcher does not know the final norm of {family} models")


def offsets(starts: list[int], size: int) -> list[int]:
    """Crop starts in pixels -> their first patch row (or column) in the image's grid."""
    return [int(round(s / size)) for s in starts]


class OVStitcher(Fix):
    """Sliding-window crops stitched into one global final block."""

    name = "ov-stitcher"
    source = "Moon, Oh, Ro 2026 (arXiv 2604.08110), atw617/OV-Stitcher (no code released)"

    def __init__(self, final: LastBlockFix | None = None) -> None:
        self.final = final

    def describe(self) -> OvStitcherDescription:
        return OvStitcherDescription(
            name=type(self).__name__,
            method=self.name,
            source=self.source,
            final_block=self.final.name if self.final is not None else "own",
        )

    def final_block(self, x: torch.Tensor, parts: BlockParts, layout: TokenLayout) -> torch.Tensor:
        """The final block on the stitched tokens ``[B, N, C]``."""
        if self.final is not None:
            return self.final.block(x, parts, layout)
        out = x + parts.attention(x)
        return out + parts.mlp(parts.ln2(out))

    def apply(self, model: Model) -> Handle:
        block_parts(model, model.n_layers - 1)  # refuses a model without a plain final block
        final_norm(model)
        handle = self.final.apply(model) if self.final is not None else Handle()
        _ACTIVE[model] = self
        handle.add(lambda: _ACTIVE.pop(model, None))
        return handle

    def stitched(
        self,
        model: Model,
        x: torch.Tensor,
        crop: tuple[int, int],
        tops: list[int],
        lefts: list[int],
    ) -> torch.Tensor:
        """``[B, h, w, C]`` final tokens (after the final norm) of the whole image ``x``, from
        crops of size ``crop`` at ``tops`` x ``lefts``."""
        layout = model.adapter.layout_for(crop)
        (gh, gw), (ph, pw) = layout.grid, layout.patch_size
        rows, cols = offsets(tops, ph), offsets(lefts, pw)
        h, w = max(rows) + gh, max(cols) + gw
        b = x.shape[0]
        grid = x.new_zeros(b, h, w, model.d_model, dtype=torch.float32)
        count = x.new_zeros(1, h, w, 1, dtype=torch.float32)
        prefix = 0.0
        for top, r in zip(tops, rows, strict=True):
            for left, c in zip(lefts, cols, strict=True):
                piece = x[..., top : top + crop[0], left : left + crop[1]]
                tokens = model.features(piece, stop_at_layer=-1).float()
                # layout: rows and columns of the image's patch grid, not tokens
                grid[:, r : r + gh, c : c + gw] += layout.patch_grid(tokens)
                count[:, r : r + gh, c : c + gw] += 1  # layout: grid rows and columns
                prefix = prefix + layout.take(tokens, "prefix")
        full = layout.with_grid((h, w))
        seq = torch.cat([prefix / (len(rows) * len(cols)), (grid / count).flatten(1, 2)], 1)
        parts = block_parts(model, model.n_layers - 1)
        seq = seq.to(model.dtype)
        out = final_norm(model)(self.final_block(seq, parts, full))
        return full.patch_grid(out)
