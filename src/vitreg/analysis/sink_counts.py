"""Sink counts as KempnerInstitute/attention_sink counts them, beside vitreg's Section-4 counts.

* The paper's tables (``lejepa_sinks/sink_table.py``): an event is the relaxed rule (>= 90% of
  the queries put >= 0.5 on the dominant key) or Definition 1 (EVERY query puts >= 1 - eps on
  it, eps <= 0.5); each event is classed by the raw value-norm ratio
  ``ratio_head = ||v_s|| / mean_(j != s) ||v_j||`` of the head's own values before W_O
  (broadcast >= 0.5, NOP <= 0.2, no stable-rank condition); counts are per image over blocks
  >= 1, split by the key's type. Block 0 is counted apart.
* The reference's head selection (``vit_causal/select_heads.py``): per class of the Section-4
  rule (:mod:`vitreg.analysis.sink_rules`), the heads with at least ``min_events`` events of
  that class, ranked by count, the top ``k_deep`` of blocks >= 1 and the top ``k_block0`` of
  block 0 apart.

Every Definition-1 event (eps <= 0.5) is a relaxed event, so the raw ratio, kept at relaxed
events, classes both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from vitreg.analysis.sink_rules import EVENT_FRACTION, ROUTE, HeadStats, sink_class
from vitreg.analysis.sink_rules import RULE as SECTION4_RULE
from vitreg.core.layout import TokenLayout
from vitreg.errors import InputError
from vitreg.results.sink_measures import (
    ClassCounts,
    KeyCounts,
    ReferenceHead,
    ReferenceHeads,
    RuleCounts,
    SinkReferenceCounts,
)

EPS = (0.5, 0.3, 0.2, 0.1)  # the tables' Definition-1 epsilons
NOP_RATIO = 0.2
BROADCAST_RATIO = 0.5
MIN_EVENTS = 50
K_DEEP = 16
K_BLOCK0 = 4

Block = tuple[int, HeadStats, TokenLayout]  # (block index, [n_images, H] statistics, layout)
EventRule = Callable[[HeadStats], torch.Tensor]  # the [n_images, H] events of one rule


def check_thresholds(eps: Sequence[float], nop_ratio: float, broadcast_ratio: float) -> None:
    """Named errors for thresholds the tables' rule cannot use."""
    for e in eps:
        if not (math.isfinite(e) and 0.0 < e <= 0.5):
            raise InputError(
                f"Definition 1's epsilon must lie in (0, 0.5] (above 0.5 a head can have several "
                f"eps-sinks, only its dominant key is kept), got {e!r}"
            )
    if not (0.0 < nop_ratio <= broadcast_ratio and math.isfinite(broadcast_ratio)):
        raise InputError(
            f"the value-ratio thresholds need 0 < NOP ratio <= broadcast ratio, got NOP "
            f"{nop_ratio!r} and broadcast {broadcast_ratio!r}"
        )


def _key_counts(mask: torch.Tensor, types: torch.Tensor, names: list[str], n: int) -> KeyCounts:
    """Per-image counts of ``mask [n_images, H]`` events, all and by key type index ``types``."""
    out = {"total": float(mask.sum()) / n}
    for i, t in enumerate(names):
        out[f"on_{t}"] = float((mask & (types == i)).sum()) / n
    return KeyCounts(**out)


def _class_counts(
    blocks: list[Block], event_of: EventRule, nop_ratio: float, bc_ratio: float, n: int
) -> ClassCounts:
    """Events, broadcast and NOP events per image over ``blocks`` (summed)."""
    names = ["cls", "register", "extra", "patch"]
    sums = {k: KeyCounts() for k in ("events", "broadcast", "nop")}
    for _, st, layout in blocks:
        labels = layout.token_types()
        types = torch.tensor([names.index(labels[k]) for k in range(len(labels))])[st.key]
        ev = event_of(st)
        raw = torch.nan_to_num(st.ratio_head, nan=-1.0)
        masks = {
            "events": ev,
            "broadcast": ev & (raw >= bc_ratio),
            "nop": ev & (raw >= 0) & (raw <= nop_ratio),
        }
        for k, m in masks.items():
            add = _key_counts(m, types, names, n)
            sums[k] = KeyCounts(
                **{f: getattr(sums[k], f) + getattr(add, f) for f in KeyCounts.model_fields}
            )
    return ClassCounts(**sums)


def _rule(eps: float | None) -> tuple[str, EventRule]:
    if eps is None:
        text = (
            f">= {EVENT_FRACTION:.0%} of the queries put >= {ROUTE} on the dominant key (relaxed)"
        )
        return text, lambda st: st.event
    text = f"every query puts >= 1 - {eps:g} on the dominant key (Definition 1, eps {eps:g})"
    return text, lambda st: st.min_a >= 1.0 - eps


def _selected(
    counts: torch.Tensor, rate: torch.Tensor, layers: list[int], k: int, least: int
) -> list[ReferenceHead]:
    items = sorted(
        (
            (int(counts[i, h]), layers[i], h, float(rate[i, h]))
            for i in range(len(layers))
            for h in range(counts.shape[1])
            if counts[i, h] >= least
        ),
        reverse=True,
    )[:k]
    return [ReferenceHead(block=b, head=h, n_events=c, event_rate=r) for c, b, h, r in items]


def reference_heads(
    blocks: list[Block],
    min_events: int = MIN_EVENTS,
    k_deep: int = K_DEEP,
    k_block0: int = K_BLOCK0,
) -> ReferenceHeads:
    """The reference's per-class head selection from the Section-4 classes."""
    if min_events < 1 or k_deep < 0 or k_block0 < 0:
        raise InputError(
            f"head selection needs min_events >= 1 and k >= 0, got {min_events}, {k_deep}, {k_block0}"
        )
    layers = [b for b, _, _ in blocks]
    found: dict[str, list[ReferenceHead]] = {}
    for cls in ("nop", "broadcast"):
        rows, rates = [], []
        for _, st, _ in blocks:
            ev = st.event
            kinds = torch.zeros_like(ev)
            bi, hi = ev.nonzero(as_tuple=True)
            got = sink_class(st.ratio[bi, hi], st.stable_rank[bi, hi])
            kinds[bi, hi] = torch.tensor([g == cls for g in got], dtype=torch.bool)
            rows.append(kinds.sum(0))
            rates.append(ev.float().mean(0))
        counts, rate = torch.stack(rows), torch.stack(rates)
        deep = [i for i, layer in enumerate(layers) if layer >= 1]
        zero = [i for i, layer in enumerate(layers) if layer == 0]
        found[cls] = _selected(
            counts[deep], rate[deep], [layers[i] for i in deep], k_deep, min_events
        )
        found[f"{cls}_block0"] = _selected(
            counts[zero], rate[zero], [0] * len(zero), k_block0, min_events
        )
    return ReferenceHeads(
        rule=SECTION4_RULE, min_events=min_events, k_deep=k_deep, k_block0=k_block0, **found
    )


def reference_counts(
    blocks: list[Block],
    n_images: int,
    eps: Sequence[float] = EPS,
    nop_ratio: float = NOP_RATIO,
    broadcast_ratio: float = BROADCAST_RATIO,
    min_events: int = MIN_EVENTS,
) -> SinkReferenceCounts:
    """The tables' counts (relaxed rule, then Definition 1 for each ``eps``) and the reference's
    head selection over the per-block statistics ``blocks``."""
    check_thresholds(eps, nop_ratio, broadcast_ratio)
    n = max(n_images, 1)
    deep = [b for b in blocks if b[0] >= 1]
    zero = [b for b in blocks if b[0] == 0]
    rules = []
    for name, e in [("relaxed", None), *(("definition1", x) for x in eps)]:
        text, event_of = _rule(e)
        rules.append(
            RuleCounts(
                name=name,
                eps=e,
                rule=text,
                from_block1=_class_counts(deep, event_of, nop_ratio, broadcast_ratio, n),
                block0=_class_counts(zero, event_of, nop_ratio, broadcast_ratio, n),
            )
        )
    return SinkReferenceCounts(
        classes_by=(
            f"raw value-norm ratio ||v_s|| / mean_(j != s) ||v_j|| of the head's values before "
            f"W_O: broadcast >= {broadcast_ratio:g}, NOP <= {nop_ratio:g}, no stable-rank "
            "condition (the paper's tables, lejepa_sinks/sink_table.py)"
        ),
        nop_ratio=nop_ratio,
        broadcast_ratio=broadcast_ratio,
        rules=rules,
        heads=reference_heads(blocks, min_events),
    )
