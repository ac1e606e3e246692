"""Massive activations (Sun et al. 2024): single residual-stream entries orders of magnitude above
the rest, on a few tokens and fixed channels.

Criterion, per image and block output (``hook_resid_post``): ``|x[t, c]| > 100`` and
``|x[t, c]| >= 1000 x median(|x|)`` over all tokens and channels of that hidden state (Sun et
al.: "magnitudes larger than 100 and at least roughly 1,000 times larger than the median
magnitude of its hidden state"). The trace keeps only the entries that pass (bounded), the
medians and per-channel maxima; the result says in which blocks, channels and tokens they sit
and whether those tokens are the high-norm tokens.
"""

from __future__ import annotations

from collections import Counter
from typing import TypedDict

import torch

from vitreg.analysis.base import Analysis, Finished
from vitreg.analysis.norms import NormsResult, norm_sites
from vitreg.core.layout import TokenLayout
from vitreg.core.renamed import renamed
from vitreg.hooks.reducers import Reducer, as_tokens
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, TraceResult
from vitreg.results.kinds import Massive, MassiveBlock, MassiveChannelRow

ABSOLUTE = 100.0
RELATIVE = 1000.0
HIGH_NORM = 3.0  # a token is high-norm at >= this x the median patch norm (the outlier-mode ratio)
MAX_ENTRIES = 20_000  # massive entries kept per block
TOP_CHANNELS = 8
RULE = (
    f"|activation| > {ABSOLUTE:g} and >= {RELATIVE:g} x the median |activation| of the image's "
    "hidden state at that block output (Sun et al. 2024, Massive Activations in LLMs)"
)


class MassiveStats(TypedDict):
    """One block output's kept entries: rows ``[k, 4]`` (image, token, channel, |value|), the
    median ``|x|`` of each image, the site and its token layout."""

    layer: int
    site: str
    medians: dict[int, float]
    entries: torch.Tensor
    layout: TokenLayout | None


class _ChannelHits(TypedDict):
    """Where one channel is massive, gathered over blocks while summarising."""

    blocks: list[int]
    rows: list[torch.Tensor]
    ratio: float
    high: list[torch.Tensor]


class MassiveEntries(Reducer[MassiveStats]):
    """Per image: the median ``|x|``; every entry passing the criterion (image, token, channel,
    value), up to :data:`MAX_ENTRIES`."""

    def __init__(self, site: str, layer: int) -> None:
        super().__init__(site)
        self.layer = layer
        self.medians: dict[int, float] = {}
        self.entries: list[torch.Tensor] = []  # [k, 4] float64: image, token, channel, value
        self.layout: TokenLayout | None = None

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        self.layout = ctx.layout
        x = as_tokens(t).float().abs()
        b = x.shape[0]
        med = x.reshape(b, -1).median(dim=1).values
        bound = torch.maximum(med * RELATIVE, torch.full_like(med, ABSOLUTE))
        hit = x > bound[:, None, None]
        for i, m in enumerate(med.tolist()):
            self.medians[image_offset + i] = m
        if hit.any() and sum(len(e) for e in self.entries) < MAX_ENTRIES:
            bi, ti, ci = hit.nonzero(as_tuple=True)
            rows = torch.stack([bi + image_offset, ti, ci], 1).double()
            self.entries.append(torch.cat([rows, x[bi, ti, ci, None].double()], 1).cpu())

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, MassiveEntries)
        self.medians.update(other.medians)
        self.entries += other.entries
        self.layout = self.layout or other.layout
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> MassiveStats:
        entries = torch.cat(self.entries)[:MAX_ENTRIES] if self.entries else torch.empty(0, 4)
        return MassiveStats(
            layer=self.layer,
            site=self.site,
            medians=self.medians,
            entries=entries,
            layout=self.layout,
        )


def _high_norm(norms: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """Bool ``[n_images, N]``: tokens at >= :data:`HIGH_NORM` x the image's median patch norm."""
    med = layout.take(norms, "patches").median(dim=1).values
    return norms >= HIGH_NORM * med[:, None]


def summarise(
    per_block: list[MassiveStats], n_images: int, norms: NormsResult | None = None
) -> Massive:
    """Turn each block's kept entries into the :class:`Massive` results (``norms``: the
    :class:`~vitreg.analysis.norms.NormsResult`, for the overlap with high-norm tokens)."""
    blocks: list[MassiveBlock] = []
    by_channel: dict[int, _ChannelHits] = {}
    on_high = total = 0
    outliers_hit = outliers_all = 0
    layout = None
    for b in per_block:
        e, layer = b["entries"], b["layer"]
        layout = b["layout"] or layout
        med = torch.tensor([b["medians"][i] for i in sorted(b["medians"])])
        images, tokens, chans = (e[:, k].long() for k in range(3))
        high = None
        if norms is not None and b["site"] in norms.trace.norms:
            tn = norms.trace.norms[b["site"]]
            lay = norms.trace.layouts[b["site"]]
            high = _high_norm(tn, lay)
            mask = norms.masks(b["site"], "auto").flatten(1)
            hit_tokens = torch.zeros_like(high)
            hit_tokens[images, tokens] = True
            outliers_all += int(mask.sum())
            outliers_hit += int((mask & lay.take(hit_tokens, "patches")).sum())
        blocks.append(
            MassiveBlock(
                block=layer,
                median_abs=float(med.median()) if len(med) else 0.0,
                entries_per_image=len(e) / max(n_images, 1),
                channels=sorted(set(chans.tolist())),
            )
        )
        for c in set(chans.tolist()):
            sel = chans == c
            entry = by_channel.setdefault(c, _ChannelHits(blocks=[], rows=[], ratio=0.0, high=[]))
            entry["blocks"].append(layer)
            entry["rows"].append(e[sel])
            ratio = e[sel, 3] / med[images[sel]].clamp_min(1e-12).double()
            entry["ratio"] = max(entry["ratio"], float(ratio.max()))
            if high is not None:
                entry["high"].append(high[images[sel], tokens[sel]])
        if high is not None:
            on_high += int(high[images, tokens].sum())
            total += len(e)
    labels = layout.token_types() if layout is not None else None
    channels = []
    for c, entry in by_channel.items():
        rows = torch.cat(entry["rows"])
        tokens = rows[:, 1].long().tolist()
        highs = torch.cat(entry["high"]) if entry["high"] else None
        channels.append(
            MassiveChannelRow(
                channel=c,
                blocks=entry["blocks"],
                hits_per_image=len(rows) / max(n_images, 1),
                max_value=float(rows[:, 3].max()),
                max_over_median=entry["ratio"],
                token_types=dict(Counter(labels[t] for t in tokens)) if labels else {},
                top_tokens=[t for t, _ in Counter(tokens).most_common(4)],
                high_norm_share=float(highs.float().mean()) if highs is not None else float("nan"),
            )
        )
    channels.sort(key=lambda ch: -ch.max_value)
    first = min((b.block for b in blocks if b.entries_per_image > 0), default=None)
    return Massive(
        present=bool(channels),
        rule=RULE,
        n_images=n_images,
        first_block=first,
        blocks=blocks,
        channels=channels[:TOP_CHANNELS],
        on_high_norm_tokens=on_high / total if total else None,
        auto_outliers_with_massive=outliers_hit / outliers_all if outliers_all else None,
        high_norm_rule=f"token norm >= {HIGH_NORM:g} x the median patch norm at that block",
        notes=[]
        if norms is not None
        else ["no norm results: overlap with high-norm tokens unknown"],
    )


class MassiveAnalysis(Analysis):
    """Massive activations at every block output (Sun et al. 2024)."""

    name = "massive"

    def reducers(self, model: Model) -> list[Reducer]:
        sites, _ = norm_sites(model)
        return [MassiveEntries(s, i) for i, s in enumerate(sites)]

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> Massive:
        per_block = [r.result() for r in trace.reducers if isinstance(r, MassiveEntries)]
        norms = done.get("norms")
        return summarise(
            per_block, trace.n_images, norms if isinstance(norms, NormsResult) else None
        )


__getattr__ = renamed(
    __name__, {"MassiveChannel": "MassiveChannelRow", "MassiveResult": "Massive"}, globals()
)
