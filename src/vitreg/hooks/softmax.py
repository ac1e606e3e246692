"""The attention probabilities from q and k, in timm's operation order (masks as SDPA applies
them): the one formula behind recomputed and streamed patterns."""

from __future__ import annotations

import torch


def additive_mask(
    n_query: int, scores: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
) -> torch.Tensor | None:
    """The additive bias SDPA applies for ``attn_mask``/``is_causal`` (timm semantics)."""
    if is_causal:
        return scores.new_full((n_query, scores.shape[-1]), float("-inf")).triu_(1)
    if attn_mask is None:
        return None
    return mask_bias(attn_mask, scores.dtype)


def mask_bias(attn_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``attn_mask`` as an additive bias: a bool mask's False is ``-inf`` (in ``dtype``), a
    float mask is its own bias."""
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros_like(attn_mask, dtype=dtype)
        return bias.masked_fill_(~attn_mask, float("-inf"))
    return attn_mask


def softmax_pattern(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor:
    """``softmax(q*scale @ k^T + mask)`` for ``[B, H, N, D]`` inputs, in timm's operation order.

    Without autograd the mask and the softmax are applied in place on the scores (one
    ``[B, H, N, N]`` buffer per pattern); the values are those of the out-of-place expression.
    """
    scores = (q * scale) @ k.transpose(-2, -1)
    bias = additive_mask(q.shape[-2], scores, attn_mask, is_causal)
    in_place = not scores.requires_grad
    if bias is not None:
        fits = torch.broadcast_shapes(scores.shape, bias.shape) == scores.shape
        scores = scores.add_(bias) if in_place and fits else scores + bias
    return torch.softmax(scores, dim=-1, out=scores) if in_place else scores.softmax(dim=-1)
