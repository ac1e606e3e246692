"""RF-CLIP (Li et al., AAAI 2026, arXiv 2511.16170; ``liblacklucy/RF-CLIP`` publishes no code):
distraction tokens found by dimension-specific over-activation, their attention and embedding
weight moved back to the targets around them, in the deep blocks.

The paper's rules, as each line below implements them (the method section was read through its
published summaries; the official repository holds a README only):

1. distractor localisation: a patch token ``f`` entering block ``l`` is a distraction token when
   ``phi = max_{j in D} |f[j]| / sum_k |f[k]| > tau`` with ``D`` the distraction channels
   ({4, 162, 474} for CLIP ViT-B/16) and ``tau = 5 / d``; the share is taken of ``|f|`` (a
   share of a signed sum is no weight);
2. defocus localisation: the targets a distraction token took its weight from are its
   non-distraction neighbours on the patch grid (3x3); the paper's graph-cut refinement of that
   set is not reproduced;
3. redistribution, one row-stochastic matrix ``M`` (``M[t] = 1/|N(t)|`` over the targets
   ``N(t)`` of a distraction token ``t``, identity elsewhere; a token without a target keeps
   its weight): the block's input becomes ``M f`` (embedding weight) and its attention
   ``softmax(q k^T s) M`` (each query's attention on ``t`` moves to ``t``'s targets), with
   the block's own residual and FFN.

Published setting: blocks 7-12 (``layers=range(6, 12)`` counted from 0) of a 12-block,
768-wide ViT-B/16; another tower needs its own ``channels`` and ``layers``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.fix.base import Fix
from vitreg.fix.blocks import BlockParts, block_parts, mix, replace_block
from vitreg.hooks.sites import Handle
from vitreg.models.model import Model
from vitreg.results.fix import RfClipDescription

CHANNELS = (4, 162, 474)  # the paper's distraction channels of CLIP ViT-B/16
LAYERS = tuple(range(6, 12))  # its blocks 7-12
WIDTH, DEPTH = 768, 12  # the tower those numbers belong to
TAU_FACTOR = 5.0  # tau = 5 / d


def distraction_mask(patches: torch.Tensor, channels: Sequence[int], tau: float) -> torch.Tensor:
    """``[B, P]``: patches ``[B, P, C]`` whose largest share of ``|f|`` in ``channels`` is above
    ``tau``."""
    mass = patches.abs()
    share = mass[..., list(channels)].amax(-1) / mass.sum(-1).clamp_min(1e-12)
    return share > tau


@functools.lru_cache(maxsize=16)
def adjacency(grid: tuple[int, int]) -> torch.Tensor:
    """``[P, P]`` 0/1: patches that are 3x3 neighbours on the grid (a patch is not its own)."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    r, c = rows.flatten(), cols.flatten()
    near = ((r[:, None] - r[None]).abs() <= 1) & ((c[:, None] - c[None]).abs() <= 1)
    return (near & ~torch.eye(h * w, dtype=torch.bool)).float()


def redistribution(mask: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """``[B, N, N]`` row-stochastic ``M``: a distraction patch's row spreads evenly over its
    non-distraction 3x3 neighbours; every other row (and a patch without one) is the identity."""
    b, n = mask.shape[0], layout.n_tokens
    adj = adjacency(layout.grid).to(mask.device)
    targets = adj[None] * (~mask).float()[:, None, :]  # [B, P, P]
    count = targets.sum(-1, keepdim=True)
    moved = mask[..., None] & (count > 0)
    eye = torch.eye(layout.n_patches, device=mask.device).expand_as(targets)
    patch_rows = torch.where(moved, targets / count.clamp_min(1), eye)
    out = torch.eye(n, device=mask.device).repeat(b, 1, 1)
    out[:, layout.patches, layout.patches] = patch_rows
    return out


class RFCLIP(Fix):
    """Distraction tokens' attention and embedding weight moved to their targets in ``layers``."""

    name = "rf-clip"
    source = "Li et al. 2026 (AAAI, arXiv 2511.16170), liblacklucy/RF-CLIP (no code released)"

    def __init__(
        self,
        channels: Sequence[int] = CHANNELS,
        layers: Sequence[int] = LAYERS,
        tau: float | None = None,
    ) -> None:
        self.channels, self.layers = tuple(int(c) for c in channels), tuple(int(i) for i in layers)
        if not self.channels or min(self.channels) < 0 or len(set(self.channels)) != len(channels):
            raise InputError(f"channels must be distinct channel indices >= 0, got {channels}")
        if not self.layers or min(self.layers) < 0 or len(set(self.layers)) != len(layers):
            raise InputError(f"layers must be distinct block indices >= 0, got {layers}")
        if tau is not None and not 0 < tau < 1:
            raise InputError(f"tau is a share of a token's |activation| in (0, 1), got {tau}")
        self.tau = tau

    def threshold(self, width: int) -> float:
        """``tau`` as given, else the paper's ``5 / d``."""
        return self.tau if self.tau is not None else TAU_FACTOR / width

    def describe(self) -> RfClipDescription:
        return RfClipDescription(
            name=type(self).__name__,
            method=self.name,
            source=self.source,
            channels=list(self.channels),
            layers=list(self.layers),
            tau=self.tau,
        )

    def _check(self, model: Model) -> None:
        d, n = model.d_model, model.n_layers
        if self.channels == CHANNELS and d != WIDTH:
            raise InputError(
                f"RF-CLIP's published channels {CHANNELS} are CLIP ViT-B/16's ({WIDTH} wide) and "
                f"this model is {d} wide; build RFCLIP(channels=...) with this tower's channels"
            )
        if self.layers == LAYERS and n != DEPTH:
            raise InputError(
                f"RF-CLIP's published blocks 7-12 are for {DEPTH}-block towers and this model has "
                f"{n}; build RFCLIP(layers=...) with blocks of this depth"
            )
        if max(self.channels) >= d:
            raise InputError(f"channels {self.channels}: all must be < the width {d}")
        if max(self.layers) >= n:
            raise InputError(f"layers {self.layers}: all must be < the depth {n}")

    def block(self, x: torch.Tensor, parts: BlockParts, layout: TokenLayout) -> torch.Tensor:
        """One redistributed block on its input ``x`` ``[B, N, C]``."""
        tau = self.threshold(x.shape[-1])
        moves = redistribution(
            distraction_mask(layout.take(x, "patches"), self.channels, tau), layout
        )
        moves = moves.to(x.dtype)
        x = moves @ x
        q, k, v = parts.qkv(parts.ln1(x))
        weights = torch.softmax((q * parts.scale) @ k.transpose(-2, -1), -1) @ moves[:, None]
        out = x + parts.attn_out(mix(weights, v))
        return out + parts.mlp(parts.ln2(out))

    def apply(self, model: Model) -> Handle:
        self._check(model)
        handle = Handle()
        try:
            for layer in self.layers:
                parts = block_parts(model, layer)
                run = lambda x, lay, p=parts: self.block(x, p, lay)  # noqa: E731
                handle.add(replace_block(model, layer, run).remove)
        except Exception:
            handle.remove()
            raise
        return handle
