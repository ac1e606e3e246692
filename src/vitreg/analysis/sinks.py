"""Attention sinks per block and head: events, NOP-like vs broadcast-like, the key they land on.

Each block's ``attn.hook_v`` and ``attn.hook_pattern`` are paired inside the trace (whichever
comes first waits for the other), so the sink statistics of :mod:`vitreg.analysis.sink_rules`
cost one pass and keep ``[n_images, heads]`` numbers per block, never the patterns. The result
gives events per image by class and key type ([CLS], register, patch), the heads that sink in
at least half the images, the block where sinks move from [CLS] to patches, and a map of how
often each patch position is the sink; beside them, the concentration ratio of every head
(:mod:`vitreg.analysis.sink_concentration`) and the counts as the reference's own code counts
them (:mod:`vitreg.analysis.sink_counts`).
"""

from __future__ import annotations

from collections import Counter
from typing import TypedDict

import torch

from vitreg.analysis.base import Analysis, Finished
from vitreg.analysis.head_writes import head_writes
from vitreg.analysis.sink_concentration import summarise_concentration
from vitreg.analysis.sink_counts import reference_counts
from vitreg.analysis.sink_rules import CLASSES, RULE, HeadStats, head_stats, sink_class, sqrt_psd
from vitreg.core.layout import TokenLayout
from vitreg.core.renamed import renamed
from vitreg.errors import UnsupportedModelError
from vitreg.hooks.reducers import Reducer
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, TraceResult
from vitreg.results.kinds import SinkBlock, SinkCounts, SinkHeadRow, Sinks
from vitreg.results.sink_measures import SinkConcentration, SinkReferenceCounts

HEAD_RATE = 0.5  # a head is a sink head when it has an event in at least this share of images
KEY_TYPES = ("cls", "register", "extra", "patch")


class _Pair:
    """The values and the pattern of one block, batch by batch, turned into :class:`HeadStats`."""

    def __init__(self, metric: torch.Tensor) -> None:
        self.metric = metric
        self._sqrt: torch.Tensor | None = None
        self.waiting: dict[int, dict[str, torch.Tensor]] = {}
        self.rows: list[tuple[int, HeadStats]] = []
        self.layout: TokenLayout | None = None

    def metric_sqrt(self) -> torch.Tensor:
        """``M^(1/2)`` per head, computed when the first event needs it."""
        if self._sqrt is None:
            self._sqrt = sqrt_psd(self.metric)
        return self._sqrt

    def put(self, kind: str, t: torch.Tensor, ctx: HookContext, offset: int) -> None:
        slot = self.waiting.setdefault(offset, {})
        slot[kind] = t
        if kind == "pattern":
            self.layout = ctx.layout
        if len(slot) == 2:
            del self.waiting[offset]
            stats = head_stats(slot["pattern"], slot["v"], self.metric, self.metric_sqrt)
            cpu = HeadStats(*(getattr(stats, f).cpu() for f in HeadStats.__dataclass_fields__))
            self.rows.append((offset, cpu))


class SinkMeasures(TypedDict):
    """The measures :func:`summarise` adds beside the Section-4 counts."""

    concentration: SinkConcentration
    reference_counts: SinkReferenceCounts


class SinkBlockStats(TypedDict):
    """One block's sink statistics over the images, each ``[n_images, H]`` (``None``: no image
    reached the block), and the layout of its keys."""

    layer: int
    stats: HeadStats | None
    layout: TokenLayout | None


class SinkValues(Reducer[None]):
    """The ``hook_v`` half of a block's pair (keeps nothing itself: its statistics are the
    :class:`SinkPatterns` half's)."""

    def __init__(self, site: str, pair: _Pair) -> None:
        super().__init__(site)
        self.pair = pair

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        self.pair.put("v", t, ctx, image_offset)

    def merge(self, other: Reducer) -> None:
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> None:
        return None


class SinkPatterns(Reducer[SinkBlockStats]):
    """The ``hook_pattern`` half of a block's pair: holds the block's statistics."""

    streams_patterns = True
    reads_pattern_columns = True

    def __init__(self, site: str, pair: _Pair, layer: int) -> None:
        super().__init__(site)
        self.pair = pair
        self.layer = layer

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        self.pair.put("pattern", t, ctx, image_offset)

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, SinkPatterns)
        self.pair.rows.extend(other.pair.rows)
        self.pair.layout = self.pair.layout or other.pair.layout
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> SinkBlockStats:
        rows = sorted(self.pair.rows, key=lambda r: r[0])
        fields = HeadStats.__dataclass_fields__
        if not rows:
            return SinkBlockStats(layer=self.layer, stats=None, layout=self.pair.layout)
        stats = HeadStats(*(torch.cat([getattr(s, f) for _, s in rows]) for f in fields))
        return SinkBlockStats(layer=self.layer, stats=stats, layout=self.pair.layout)


def sink_heads(sinks: Sinks, kind: str) -> list[SinkHeadRow]:
    """The sink heads whose events are mostly of class ``kind`` ("nop", "broadcast", "other")."""
    if kind not in CLASSES:
        raise ValueError(f"unknown sink class {kind!r}; choose from {CLASSES}")
    return [h for h in sinks.heads if h.kind == kind]


def _key_types(key: torch.Tensor, layout: TokenLayout) -> list[str]:
    labels = layout.token_types()
    return [labels[k] for k in key.flatten().tolist()]


def _counts(kinds: list[str], types: list[str], n_images: int) -> dict[str, float]:
    out = {"total": len(kinds) / max(n_images, 1)}
    for c, n in Counter(kinds).items():
        out[c] = n / max(n_images, 1)
    for t, n in Counter(types).items():
        out[f"on_{t}"] = n / max(n_images, 1)
    return {k: float(v) for k, v in sorted(out.items())}


def summarise(per_block: list[SinkBlockStats], n_images: int) -> Sinks:
    """Turn each block's ``[n_images, H]`` statistics into the :class:`Sinks` results."""
    layout: TokenLayout = next(b["layout"] for b in per_block if b["layout"] is not None)
    h, w = layout.grid
    patch_map = torch.zeros(h * w)
    all_kinds: list[str] = []
    all_types: list[str] = []
    from1_kinds: list[str] = []
    from1_types: list[str] = []
    blocks: list[SinkBlock] = []
    heads: list[SinkHeadRow] = []
    n_heads = 0
    for b in per_block:
        st, layer = b["stats"], b["layer"]
        if st is None:
            continue
        event = st.routed >= 0.9
        n_heads = event.shape[1]
        ki, hi = event.nonzero(as_tuple=True)
        kinds = sink_class(st.ratio[ki, hi], st.stable_rank[ki, hi])
        keys = st.key[ki, hi]
        types = _key_types(keys, layout)
        all_kinds += kinds
        all_types += types
        if layer >= 1:
            from1_kinds += kinds
            from1_types += types
        for k, t in zip(keys.tolist(), types, strict=True):
            if t == "patch":
                patch_map[k - layout.patches.start] += 1
        blocks.append(SinkBlock(block=layer, **_counts(kinds, types, n_images)))
        for head in range(n_heads):
            mine = (hi == head).nonzero(as_tuple=True)[0].tolist()
            rate = len(mine) / max(n_images, 1)
            if rate < HEAD_RATE:
                continue
            kind = Counter(kinds[i] for i in mine).most_common(1)[0][0]
            key = Counter(int(keys[i]) for i in mine).most_common(1)[0][0]
            key_type = layout.token_types()[key]
            cell = key - layout.patches.start
            pos = [cell // w, cell % w] if key_type == "patch" else None
            sel = (ki[mine], hi[mine])
            heads.append(
                SinkHeadRow(
                    block=layer,
                    head=head,
                    rate=rate,
                    kind=kind,
                    key_type=key_type,
                    key_position=pos,
                    ratio=float(st.ratio[sel].median()),
                    stable_rank=float(st.stable_rank[sel].median()),
                )
            )
    n_reg_events = sum(t == "register" for t in all_types)
    return Sinks(
        present=bool(heads),
        rule=RULE,
        n_images=n_images,
        n_heads=n_heads,
        head_rate_threshold=HEAD_RATE,
        per_image=SinkCounts(**_counts(all_kinds, all_types, n_images)),
        per_image_from_block1=SinkCounts(**_counts(from1_kinds, from1_types, n_images)),
        blocks=blocks,
        heads=heads,
        transition_block=transition_block(blocks),
        register_share=(n_reg_events / len(all_types) if all_types else 0.0)
        if layout.n_reg
        else None,
        patch_map=(patch_map / max(n_images, 1)).reshape(h, w).tolist(),
        notes=[],
        **measures(per_block, n_images, layout),
    )


def measures(per_block: list[SinkBlockStats], n_images: int, layout: TokenLayout) -> SinkMeasures:
    """The concentration ratio and the reference's own counts of the blocks with statistics."""
    seen = [
        (b["layer"], b["stats"], b["layout"] or layout) for b in per_block if b["stats"] is not None
    ]
    conc = summarise_concentration([b for b, _, _ in seen], [s.concentration for _, s, _ in seen])
    return SinkMeasures(concentration=conc, reference_counts=reference_counts(seen, n_images))


def transition_block(blocks: list[SinkBlock]) -> int | None:
    """The first block after one with [CLS] sinks from which patch sinks outnumber [CLS] sinks
    in every later block with sinks (None: sinks never move from [CLS] to patches)."""
    seen_cls = False
    candidate = None
    for b in blocks:
        on_cls, on_patch = b.on_cls, b.on_patch
        if on_cls + on_patch == 0:
            continue
        if on_patch > on_cls and seen_cls:
            candidate = b.block if candidate is None else candidate
        else:
            candidate = None
        seen_cls = seen_cls or on_cls > 0
    return candidate


class SinkAnalysis(Analysis):
    """Sink events and classes of every head of every block (Fesser et al. 2026)."""

    name = "sinks"

    def not_applicable(self, model: Model) -> str | None:
        names = set(model.hook_names())
        if not any(n.endswith("attn.hook_pattern") for n in names):
            return "the model has no attention pattern sites"
        try:
            for i in range(model.n_layers):
                head_writes(model, i)
        except UnsupportedModelError as e:
            return f"sink classes need each head's W_O and LayerScale: {e}"
        return None

    def reducers(self, model: Model) -> list[Reducer]:
        out: list[Reducer] = []
        for i in range(model.n_layers):
            p = f"blocks.{i}.attn"
            pair = _Pair(head_writes(model, i).value_metric().to(model.device))
            out += [SinkValues(f"{p}.hook_v", pair), SinkPatterns(f"{p}.hook_pattern", pair, i)]
        return out

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> Sinks:
        per_block = [r.result() for r in trace.reducers if isinstance(r, SinkPatterns)]
        return summarise(per_block, trace.n_images)


__getattr__ = renamed(__name__, {"SinkHead": "SinkHeadRow", "SinkResult": "Sinks"}, globals())
