"""The attention-sink rules of Fesser et al. (2026, "A Unifying View of Attention Sinks"), as
written in their code (KempnerInstitute/attention_sink, ``vit_causal/common.py``).

For one image, block and head with attention ``A [N, N]`` (all queries, all keys):

* dominant key ``s = argmax_j mean_i A_ij``; ``mass = mean_i A_is``;
* sink event: ``routed = mean_i [A_is >= 0.5] >= 0.9`` (their relaxed Definition 1);
* ``ratio = ||u_s|| / mean_{j != s} ||u_j||`` with ``u_j = gamma * W_O^h v_j`` (the values as the
  residual stream receives them);
* NOP-like: ``ratio <= 0.2``; broadcast-like: ``ratio >= 0.5`` and stable rank
  ``||U||_F^2 / sigma_1(U)^2 <= 1.5`` of the head update ``U = A u`` (N x C); else "other".

The ratio and the stable rank are computed only for events (the classes need them only there):
``||u_j||^2 = v_j^T M v_j`` with ``M = W^T diag(gamma^2) W``, and the stable rank from the
``D x D`` matrix ``S G S`` (``G = (A v)^T (A v)``, ``S = M^(1/2)``), whose eigenvalues are the
squared singular values of ``U``: exact, without forming ``U``. A batch without events costs one
pass over the pattern (the mean column, then the dominant key's column).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vitreg.analysis.sink_concentration import concentration_ratio
from vitreg.hooks.streamed import StreamedPattern, column_mean, head_gram, key_column

ROUTE = 0.5  # A_is a query must put on the dominant key
EVENT_FRACTION = 0.9  # share of queries that must do so
NOP_RATIO = 0.2
BROADCAST_RATIO = 0.5
BROADCAST_RANK = 1.5
CLASSES = ("nop", "broadcast", "other")


@dataclass
class HeadStats:
    """Sink statistics of a batch, each ``[B, H]``; ``ratio``, ``stable_rank`` and
    ``ratio_head`` are NaN where no event. ``min_a = min_i A_is`` (Definition 1 reads it),
    ``ratio_head`` the raw value-norm ratio ``||v_s|| / mean_(j != s) ||v_j||`` before W_O (the
    paper's tables classify by it) and ``concentration`` the column-sum ratio
    ``max_j c_j / median_j c_j`` of :mod:`vitreg.analysis.sink_concentration`."""

    key: torch.Tensor
    mass: torch.Tensor
    routed: torch.Tensor
    ratio: torch.Tensor
    stable_rank: torch.Tensor
    min_a: torch.Tensor
    ratio_head: torch.Tensor
    concentration: torch.Tensor

    @property
    def event(self) -> torch.Tensor:
        return self.routed >= EVENT_FRACTION


def sqrt_psd(m: torch.Tensor) -> torch.Tensor:
    """Symmetric square root of a batch of PSD matrices (float64)."""
    ev, vec = torch.linalg.eigh(m.double())
    return (vec * ev.clamp_min(0).sqrt()[..., None, :]) @ vec.transpose(-1, -2)


@dataclass
class DominantKeys:
    """Per image and head ``[B, H]``: the mean attention columns ``[B, H, N]``, the dominant
    key and its mean attention, its column over the queries ``[B, H, N]``, the share of queries
    routed to it and whether that share is a sink event."""

    columns: torch.Tensor
    mass: torch.Tensor
    key: torch.Tensor
    column: torch.Tensor
    routed: torch.Tensor
    event: torch.Tensor


def dominant_keys(pattern: torch.Tensor | StreamedPattern) -> DominantKeys:
    """The dominant key of each head of ``pattern [B, H, N, N]`` (full or streamed) and the
    sink-event rule on it: one pass for the mean columns, one for the key's column."""
    columns = column_mean(pattern)
    mass, key = columns.max(dim=-1)
    column = key_column(pattern, key)
    routed = (column >= ROUTE).float().mean(-1)
    return DominantKeys(columns, mass, key, column, routed, routed >= EVENT_FRACTION)


def head_stats(
    pattern: torch.Tensor | StreamedPattern,
    v: torch.Tensor,
    metric: torch.Tensor,
    metric_sqrt: Callable[[], torch.Tensor],
) -> HeadStats:
    """Sink statistics of ``pattern [B, H, N, N]`` (full or streamed) and values
    ``v [B, N, H, D]`` given the per-head ``metric = W_h^T diag(gamma^2) W_h [H, D, D]`` and a
    function returning its square root (called only when some head has an event)."""
    dom = dominant_keys(pattern)
    mass, key, routed, event = dom.mass, dom.key, dom.routed, dom.event
    ratio = torch.full_like(routed, float("nan"))
    rank = torch.full_like(routed, float("nan"))
    raw = torch.full_like(routed, float("nan"))
    if event.any():
        with torch.autocast(routed.device.type, enabled=False):  # float32 under autocast too
            _event_stats(pattern, v, metric, metric_sqrt, key, event, ratio, rank)
            raw[event] = _raw_ratio(v, key, event).to(raw)
    conc = concentration_ratio(dom.columns)
    return HeadStats(key, mass, routed, ratio, rank, dom.column.min(-1).values, raw, conc)


def _raw_ratio(v: torch.Tensor, key: torch.Tensor, event: torch.Tensor) -> torch.Tensor:
    """``||v_s|| / mean_(j != s) ||v_j||`` of the head's own values (before W_O) at each event."""
    bi, hi = event.nonzero(as_tuple=True)
    norms = v.float()[bi, :, hi].norm(dim=-1)  # [E, N]
    vs = norms.gather(1, key[bi, hi, None]).squeeze(-1)
    other = (norms.sum(-1) - vs) / max(norms.shape[-1] - 1, 1)
    return vs / other.clamp_min(1e-12)


def _event_stats(
    pattern: torch.Tensor | StreamedPattern,
    v: torch.Tensor,
    metric: torch.Tensor,
    metric_sqrt: Callable[[], torch.Tensor],
    key: torch.Tensor,
    event: torch.Tensor,
    ratio: torch.Tensor,
    rank: torch.Tensor,
) -> None:
    """Fill ``ratio`` and ``stable_rank`` at the events of :func:`head_stats`."""
    n = pattern.shape[2]
    bi, hi = event.nonzero(as_tuple=True)
    ve = v.float()[bi, :, hi]  # [E, N, D]: the values of each event head
    # ||u_j||^2 = v_j^T M_h v_j, one [N, D] @ [D, D] product per event
    sq = torch.linalg.vecdot(ve @ metric.to(ve)[hi], ve).clamp_min(0)
    un = sq.sqrt()
    us = un.gather(1, key[bi, hi, None]).squeeze(-1)
    other = (un.sum(-1) - us) / max(n - 1, 1)
    ratio[bi, hi] = us / other.clamp_min(1e-12)
    gram = head_gram(pattern, bi, hi, ve)  # (A v)^T (A v) of each event head
    s = metric_sqrt().to(gram.device)[hi]
    ev = torch.linalg.eigvalsh(s @ gram @ s).clamp_min(0)
    rank[bi, hi] = (ev.sum(-1) / ev[:, -1].clamp_min(1e-30)).to(rank)


def sink_class(ratio: torch.Tensor, stable_rank: torch.Tensor) -> list[str]:
    """The class of each event (flat): "nop", "broadcast" or "other"."""
    out = []
    for r, sr in zip(ratio.flatten().tolist(), stable_rank.flatten().tolist(), strict=True):
        if r <= NOP_RATIO:
            out.append("nop")
        elif r >= BROADCAST_RATIO and sr <= BROADCAST_RANK:
            out.append("broadcast")
        else:
            out.append("other")
    return out


RULE = (
    f"sink event: >= {EVENT_FRACTION:.0%} of all queries put >= {ROUTE} on the dominant key "
    f"(argmax of the mean attention column); NOP-like: ||u_s|| / mean_(j != s) ||u_j|| <= "
    f"{NOP_RATIO} with u = LayerScale * W_O^h v; broadcast-like: that ratio >= "
    f"{BROADCAST_RATIO} and stable rank of the head update A u <= {BROADCAST_RANK} "
    "(Fesser et al. 2026, KempnerInstitute/attention_sink)"
)
