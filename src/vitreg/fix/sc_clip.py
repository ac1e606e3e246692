"""SC-CLIP (Bai et al., arXiv 2411.15869; code ``SuleBai/SC-CLIP``, ``clip/model.py``
``VisionTransformer.forward``, defaults of ``configs/base_config.py``), batch-correct:

1. penultimate block: Local Outlier Factor over the patch tokens (30 neighbours, squared
   distances, the official reach-distance rule); patches above the 95% score quantile are
   replaced by the mean of their valid 3x3 neighbours;
2. the block-8 patches (same repair) give a cosine map ``S``; ``S >= 0.4`` re-aggregates the
   repaired tokens before the last block;
3. last block on the patches only: ``attn_out(((softmax(3 (S - mean S)), -inf below the mean)
   + softmax(k k^T s)) / 2 v) + 0.3 [CLS]``, re-aggregated by the thresholded block-3 map;
4. multi-level fusion: the sum of blocks 3-9 goes through the same last block and is added.

Block indices count from 0 (the official ``feats_list``). The official code runs one image at
a time (``squeeze(1)``, one mean over the map); here every statistic is per image. SC-CLIP
defines patch outputs only: the [CLS] and other prefix slots pass the penultimate tokens
through unchanged, so pooled outputs under this fix are not SC-CLIP's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.fix.base import Fix
from vitreg.fix.blocks import BlockParts, block_parts, mix, replace_block
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import Handle, HookContext
from vitreg.models.model import Model
from vitreg.results.fix import ScClipDescription

PUBLISHED_DEPTH = 12  # the indices below are the paper's for 12-block towers (ViT-B/16)


def squared_distances(x: torch.Tensor) -> torch.Tensor:
    """``[B, N, N]`` squared Euclidean distances between the tokens ``[B, N, C]``, as
    ``|a|^2 + |b|^2 - 2 a.b`` in float64 (one matrix product: 11x faster on CPU than float32
    differences, and exact to ~1e-13 relative where float32 products lose small distances to
    cancellation), returned in float32 or ``x``'s wider dtype (half precision would overflow
    on high-norm tokens)."""
    y = x.double()
    sq = y.square().sum(-1)
    d = sq[:, :, None] + sq[:, None, :] - 2 * (y @ y.transpose(-2, -1))
    return d.clamp_min(0).to(torch.promote_types(x.dtype, torch.float32))


def lof_outliers(x: torch.Tensor, n_neighbors: int, contamination: float) -> torch.Tensor:
    """``[B, N]`` mask of the tokens whose official LOF score exceeds its ``1 - contamination``
    quantile, per image (``x``: ``[B, N, C]``)."""
    d = squared_distances(x)
    knn_d, knn_i = torch.topk(d, k=n_neighbors + 1, largest=False)
    knn_d, knn_i = knn_d[..., 1:], knn_i[..., 1:]  # drop the token itself
    reach = torch.maximum(knn_d, knn_d[..., -1:])  # the official rule: own k-distance
    lrd = n_neighbors / torch.nan_to_num(reach.mean(-1), nan=1e-6)  # [B, N]
    scores = (torch.gather(lrd, 1, knn_i.flatten(1)).view_as(knn_i) / lrd[..., None]).mean(-1)
    threshold = torch.quantile(scores.float(), 1 - contamination, dim=1, keepdim=True)
    return scores > threshold


def neighbour_mean(grid: torch.Tensor, outliers: torch.Tensor) -> torch.Tensor:
    """``grid`` ``[B, h, w, C]`` with each outlier cell replaced by the mean of its non-outlier
    3x3 neighbours (zero padding; cells without one keep their value)."""
    keep = (~outliers).to(grid.dtype)[:, None]  # [B, 1, h, w]
    feats = grid.permute(0, 3, 1, 2) * keep
    ring = torch.ones(1, 1, 3, 3, dtype=grid.dtype, device=grid.device)
    ring[..., 1, 1] = 0
    c = feats.shape[1]
    total = F.conv2d(F.pad(feats, (1, 1, 1, 1)), ring.expand(c, 1, 3, 3), groups=c)
    count = F.conv2d(F.pad(keep, (1, 1, 1, 1)), ring)
    mean = total / count.clamp(min=1)
    update = (outliers[:, None] & (count > 0)).to(grid.dtype)
    out = grid.permute(0, 3, 1, 2) * (1 - update) + mean * update
    return out.permute(0, 2, 3, 1)


def aggregate(x: torch.Tensor, corr: torch.Tensor) -> torch.Tensor:
    """Row-normalised ``corr`` ``[B, N, N]`` applied to ``x`` ``[B, N, C]`` (official +1e-6)."""
    return (corr / (corr.sum(-1, keepdim=True) + 1e-6)) @ x


def cosine_map(patches: torch.Tensor) -> torch.Tensor:
    """``[B, N, N]`` cosine similarity between the patch tokens ``[B, N, C]``."""
    unit = patches / patches.norm(dim=-1, keepdim=True)
    return unit @ unit.transpose(-2, -1)


class SCCLIP(Fix):
    """LOF token repair, similarity re-aggregation and multi-level fusion around the last block."""

    name = "sc-clip"
    source = "Bai et al. 2024 (arXiv 2411.15869), SuleBai/SC-CLIP"

    def __init__(
        self,
        n_neighbors: int = 30,
        contamination: float = 0.05,
        beta: float = 0.4,
        pre_adjust: int = 8,
        post_adjust: int = 3,
        multi: tuple[int, int] = (3, 10),
        res_cls: float = 0.3,
    ) -> None:
        if n_neighbors < 1 or not 0 < contamination < 1:
            raise InputError("n_neighbors must be >= 1 and contamination in (0, 1)")
        if not 0 <= multi[0] < multi[1]:
            raise InputError(f"multi must be a block range (start, stop), got {multi}")
        self.n_neighbors, self.contamination, self.beta = n_neighbors, contamination, beta
        self.pre_adjust, self.post_adjust, self.multi = pre_adjust, post_adjust, tuple(multi)
        self.res_cls = res_cls

    def describe(self) -> ScClipDescription:
        return ScClipDescription(
            name=type(self).__name__,
            method=self.name,
            source=self.source,
            n_neighbors=self.n_neighbors,
            contamination=self.contamination,
            beta=self.beta,
            pre_adjust=self.pre_adjust,
            post_adjust=self.post_adjust,
            multi=list(self.multi),
            res_cls=self.res_cls,
        )

    def _layers(self) -> list[int]:
        return sorted({self.pre_adjust, self.post_adjust, *range(*self.multi)})

    def _check(self, model: Model) -> None:
        n = model.n_layers
        if not model.layout.n_cls:
            raise UnsupportedModelError(
                f"{model.family} models have no [CLS] token, and SC-CLIP adds 0.3 x [CLS] to "
                "every patch of its last block; it is defined on CLIP-style towers only"
            )
        published = (self.pre_adjust, self.post_adjust, self.multi) == (8, 3, (3, 10))
        if published and n != PUBLISHED_DEPTH:
            raise InputError(
                f"SC-CLIP's published block indices (8, 3, 3-9) are for {PUBLISHED_DEPTH}-block "
                f"towers and this model has {n}; build SCCLIP(pre_adjust=, post_adjust=, "
                "multi=) with indices for this depth"
            )
        if max(self._layers()) >= n - 2:
            raise InputError(f"SC-CLIP reads blocks {self._layers()}: all must be < {n - 2}")

    def _attend(
        self, x: torch.Tensor, mid: torch.Tensor, parts: BlockParts, cls: torch.Tensor
    ) -> torch.Tensor:
        """The official ``custom_attn`` on patches ``x`` plus ``res_cls`` times ``cls``."""
        q, k, v = parts.qkv(parts.ln1(x))
        shifted = (mid - mid.mean(dim=(1, 2), keepdim=True)) * 3.0
        shifted = shifted.masked_fill(shifted < 0, float("-inf"))
        weights = torch.softmax(shifted, -1)[:, None] + torch.softmax(
            (k @ k.transpose(-2, -1)) * parts.scale, -1
        )
        return parts.attn_out(mix(weights / 2, v)) + self.res_cls * cls[:, None]

    def apply(self, model: Model) -> Handle:
        self._check(model)
        last = model.n_layers - 1
        parts = block_parts(model, last)
        saved: dict[int, torch.Tensor] = {}
        state: dict[str, torch.Tensor] = {}

        def keep(layer: int):
            def fn(t: torch.Tensor, hook: HookContext) -> None:
                saved[layer] = t

            return fn

        def repair(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
            lay = hook.layout
            if lay.n_patches <= self.n_neighbors:
                raise InputError(
                    f"LOF with {self.n_neighbors} neighbours needs more than {self.n_neighbors} "
                    f"patches, this input has {lay.n_patches}; use larger images"
                )
            patches = lay.take(t, "patches")
            mask = lof_outliers(patches, self.n_neighbors, self.contamination)
            state["mask"] = mask.view(-1, *lay.grid)
            state["cls"] = lay.cls_token(t)
            fixed = neighbour_mean(lay.patch_grid(t), state["mask"]).flatten(1, 2)
            out = t.clone()
            out[:, lay.patches] = fixed
            return out

        def block(x: torch.Tensor, lay: TokenLayout) -> torch.Tensor:
            mask, cls = state.pop("mask"), state.pop("cls")
            pre = neighbour_mean(lay.patch_grid(saved[self.pre_adjust]), mask).flatten(1, 2)
            mid = cosine_map(pre)
            patches = aggregate(lay.take(x, "patches"), mid * (mid >= self.beta))
            after = cosine_map(lay.take(saved[self.post_adjust], "patches"))
            after = after * (after >= self.beta)
            fused = sum(saved[i] for i in range(*self.multi))
            # the last block on the repaired patches and on the fused ones, as one batch
            both = self._attend(
                torch.cat([patches, lay.take(fused, "patches")]),
                torch.cat([mid, mid]),
                parts,
                torch.cat([cls, lay.cls_token(fused)]),
            )
            out, extra = both.chunk(2)
            result = x.clone()
            result[:, lay.patches] = aggregate(out, after) + aggregate(extra, after)
            saved.clear()
            return result

        hooks = [(hook_name(i, "hook_resid_post"), keep(i)) for i in self._layers()]
        hooks.append((hook_name(last - 1, "hook_resid_post"), repair))
        handle = model.hooks(hooks)
        try:
            handle.add(replace_block(model, last, block).remove)
        except Exception:
            handle.remove()
            raise
        return handle
