"""Token-pruning scores: which patch tokens a pruner keeps. [CLS] attention (VisionZip), received
attention (column sums), SToP's sink-aware [CLS] attention and a seeded random ranking; the top-k
patches by a score are kept and their final features averaged."""

from __future__ import annotations

import torch
from torch import Tensor

from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError

SINK_MU = 0.03  # SToP's mu_s with VisionZip (its default for LLaVA-OneVision)
SINK_GAMMA = 1.1  # SToP's gamma
KEEP_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
CLS = "cls-attention"
RECEIVED = "received-attention"
SINK_AWARE = "sink-aware"
RANDOM = "random"
ARMS = (CLS, RECEIVED, SINK_AWARE, RANDOM)


def _real(x: Tensor) -> Tensor:
    """``x`` in float32 at least (float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def minmax_rows(x: Tensor, eps: float = 1e-12) -> Tensor:
    """Each row of ``x [F, N]`` rescaled to [0, 1] over its last dimension."""
    lo = x.amin(dim=1, keepdim=True)
    hi = x.amax(dim=1, keepdim=True)
    return (x - lo) / (hi - lo + eps)


def sink_score(attention: Tensor, gamma: float = SINK_GAMMA) -> Tensor:
    """SToP's sink score of ``attention [F, N]`` (F frames, N tokens): each position's attention
    averaged over the frames, raised to ``gamma`` and min-max normalised over the positions; the
    same row for every frame. A position that draws attention in every frame scores 1."""
    persistent = _real(attention).mean(0, keepdim=True).pow(gamma)
    return minmax_rows(persistent).expand_as(attention)


def sink_aware(attention: Tensor, mu: float = SINK_MU, gamma: float = SINK_GAMMA) -> Tensor:
    """SToP's sink-aware attention: ``attention - mu * sink_score(attention, gamma)``."""
    return _real(attention) - mu * sink_score(attention, gamma)


def cls_attention(pattern: Tensor, layout: TokenLayout) -> Tensor:
    """``[B, H, N, N]`` attention -> the [CLS] query's row over the patch keys, mean of heads
    ``[B, P]`` (VisionZip's dominant-token score)."""
    row = layout.cls_token(pattern.float().mean(1), dim=1)
    return layout.take(row, "patches", dim=1)


def received_attention(pattern: Tensor, layout: TokenLayout) -> Tensor:
    """``[B, H, N, N]`` attention -> the attention each patch key receives, summed over every
    query and averaged over heads ``[B, P]``."""
    return layout.take(pattern.float().mean(1).sum(1), "patches", dim=1)


def attention_scores(
    pattern: Tensor, layout: TokenLayout, mu: float, gamma: float
) -> dict[str, Tensor]:
    """The attention arms' scores ``[B, P]`` of one batch; the batch's images are SToP's frames."""
    cls = cls_attention(pattern, layout)
    return {
        CLS: cls,
        RECEIVED: received_attention(pattern, layout),
        SINK_AWARE: sink_aware(cls, mu, gamma),
    }


def random_ranking(n_patches: int, seed: int) -> Tensor:
    """One seeded random score per patch position ``[P]`` (the same for every image)."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n_patches, generator=g)


def check_ratios(ratios: tuple[float, ...]) -> tuple[float, ...]:
    """Keep ratios as given, each in (0, 1] and none repeated, or an :class:`InputError`."""
    if not ratios:
        raise InputError("pruning needs at least one keep ratio, e.g. 0.1,0.5,0.9")
    bad = [r for r in ratios if not 0.0 < float(r) <= 1.0]
    if bad:
        raise InputError(
            f"keep ratio {bad[0]!r} is out of range: a keep ratio is the share of patch tokens "
            "kept, above 0 and at most 1 (e.g. 0.1 keeps 10%)"
        )
    if len(set(ratios)) != len(ratios):
        raise InputError(f"keep ratios repeat: {list(ratios)}; give each once")
    return tuple(float(r) for r in ratios)


def keep_count(ratio: float, n_patches: int) -> int:
    """How many of ``n_patches`` a keep ratio keeps: ``round(ratio * n)``, at least one."""
    return max(1, min(n_patches, round(ratio * n_patches)))


def kept_mean(features: Tensor, scores: Tensor, k: int) -> Tensor:
    """Mean of the ``k`` highest-scoring patches' features: ``[B, P, D]``, ``[B, P]`` -> ``[B, D]``."""
    top = scores.topk(k, dim=1).indices
    picked = features.gather(1, top[..., None].expand(-1, -1, features.shape[-1]))
    return picked.mean(1)
