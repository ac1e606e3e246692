"""Attention computed once where its statistics are read: while a traced attention module runs,
its ``F.scaled_dot_product_attention`` call on the very q and k of a streamed pattern is answered
by :meth:`~vitreg.hooks.streamed.StreamedPattern.attend`, which gives the output and fills the
pattern's column sums and row log-sum-exp in the same pass (the fused kernel and a second
``q k^T`` for the statistics would compute the scores twice).

Only on CPU without autograd (a GPU's fused kernel is faster than both passes together); any
other call, and every call where the pattern does not match, goes to the original function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from vitreg.hooks.streamed import StreamedPattern

_SDPA_ARGS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def can_attend(pattern: StreamedPattern) -> bool:
    """Whether ``pattern``'s attention may be computed by :meth:`StreamedPattern.attend`."""
    return pattern.q.device.type == "cpu" and not (
        torch.is_grad_enabled() and (pattern.q.requires_grad or pattern.k.requires_grad)
    )


def _matches(pattern: StreamedPattern, query: Any, key: Any, kw: dict[str, Any]) -> bool:
    """Whether an SDPA call with these arguments computes ``pattern``'s attention."""
    scale = kw.get("scale")
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    return (
        query is pattern.q
        and key is pattern.k
        and kw.get("attn_mask") is pattern.attn_mask
        and bool(kw.get("is_causal", False)) == pattern.is_causal
        and not kw.get("dropout_p", 0.0)
        and not kw.get("enable_gqa", False)
        and scale == pattern.scale
    )


def answer_sdpa(pattern: StreamedPattern) -> Callable[[], None]:
    """From now on the first SDPA call on ``pattern``'s q and k is answered by ``pattern``
    (:meth:`StreamedPattern.attend`); returns the function that puts the original back."""
    original = F.scaled_dot_product_attention
    done = False

    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kw: Any):
        nonlocal done
        given = {**dict(zip(_SDPA_ARGS, args, strict=False)), **kw}
        if done or not _matches(pattern, query, key, given):
            return original(query, key, value, *args, **kw)
        done = True
        return pattern.attend(value)

    def restore() -> None:
        F.scaled_dot_product_attention = original

    F.scaled_dot_product_attention = sdpa
    return restore
