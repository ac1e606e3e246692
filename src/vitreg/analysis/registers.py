"""Register tokens as their own group: their norms, the attention they receive, the sinks and
massive activations they hold, and whether they absorbed the artifacts.

Trained registers (Darcet et al. 2024; DINOv2-reg, DINOv3's 4 storage tokens) and test-time
registers (the ``extra`` tokens vitreg inserts) are meant to take over the high-norm,
attention-sink role patches play otherwise; a DINOv2-L *with* registers can still concentrate
attention on one token (dinov2 PR #306). The verdict: registers **absorbed** the artifacts when
patches show no outlier mode and no position-tied outliers, while the registers carry them
(median register norm >= 3x the median patch norm in some block, or most sink events land on a
register); **did not** when patches still carry outliers or most sinks land on patches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vitreg.analysis.base import Analysis
from vitreg.analysis.massive import HIGH_NORM
from vitreg.hooks.reducers import Reducer, type_index
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, TraceResult

GROUPS = ("cls", "register", "extra", "patch")


class ReceivedAttention(Reducer):
    """Attention mass each token type receives (mean over queries, heads and images)."""

    def __init__(self, site: str, layer: int) -> None:
        super().__init__(site)
        self.layer = layer
        self.sums: dict[str, float] = {}
        self.count = 0

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        received = t.float().mean(dim=2)  # [B, H, N_k]: mean over queries
        for kind, sl in type_index(ctx, received.shape[-1]).items():
            self.sums[kind] = self.sums.get(kind, 0.0) + float(received[..., sl].sum(-1).sum())
        self.count += received.shape[0] * received.shape[1]

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, ReceivedAttention)
        for k, v in other.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.count += other.count
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> dict[str, Any]:
        return {k: v / max(self.count, 1) for k, v in self.sums.items()}


@dataclass
class RegisterResult:
    """Register tokens (trained and inserted) summarised per block, and the absorption verdict."""

    n_registers: int
    n_extra: int
    blocks: list[dict[str, Any]]  # per block: median norms per group, attention share per group
    sink_share: float | None
    massive_share: float | None  # share of massive entries on register tokens
    absorbed: bool | None  # None: the model has no register tokens
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_registers": self.n_registers,
            "n_extra": self.n_extra,
            "absorbed": self.absorbed,
            "why": self.why,
            "sink_share": self.sink_share,
            "massive_share": self.massive_share,
            "register_over_patch_norm_max": max(
                (b["register_over_patch"] for b in self.blocks if b["register_over_patch"]),
                default=None,
            ),
            "rule": f"absorbed: no patch outlier mode, no position-tied outliers, and registers "
            f"at >= {HIGH_NORM:g}x the median patch norm in some block or holding most sink "
            "events",
            "blocks": self.blocks,
        }


def _group_norms(norms: Any) -> list[dict[str, Any]]:
    """Median token norm of each group at every block output."""
    out = []
    for i, site in enumerate(norms.trace.sites):
        lay, tn = norms.trace.layouts[site], norms.trace.norms[site]
        row: dict[str, Any] = {"block": i}
        parts = {
            "cls": lay.cls,
            "register": lay.registers,
            "extra": lay.extra,
            "patch": lay.patches,
        }
        for kind, sl in parts.items():
            if sl.stop > sl.start:
                row[f"{kind}_norm"] = float(tn[:, sl].median())
        regs = [row.get("register_norm"), row.get("extra_norm")]
        top = max((r for r in regs if r is not None), default=None)
        row["register_over_patch"] = top / max(row["patch_norm"], 1e-12) if top else None
        out.append(row)
    return out


def summarise(
    layout: Any, done: dict[str, Any], received: dict[int, dict[str, float]]
) -> RegisterResult:
    """The register group and the verdict, from the earlier analyses' results."""
    n_reg, n_extra = layout.n_reg, layout.n_extra
    norms, sinks = done.get("norms"), done.get("sinks")
    massive, positions = done.get("massive"), done.get("positions")
    blocks = _group_norms(norms) if norms is not None else []
    for b in blocks:
        b["attention_share"] = received.get(b["block"], {})
    sink_share = None
    if sinks is not None and sinks.per_image.get("total"):
        on = sinks.per_image.get("on_register", 0.0) + sinks.per_image.get("on_extra", 0.0)
        sink_share = on / sinks.per_image["total"]
    massive_share = None
    if massive is not None and massive.channels:
        types = [ch.token_types for ch in massive.channels]
        total = sum(sum(t.values()) for t in types)
        massive_share = sum(t.get("register", 0) + t.get("extra", 0) for t in types) / total
    if n_reg + n_extra == 0:
        return RegisterResult(0, 0, blocks, None, None, None, "the model has no register tokens")
    patch_outliers = bool(norms is not None and norms.report.verdict)
    positional = bool(positions is not None and positions.present)
    high = any((b["register_over_patch"] or 0) >= HIGH_NORM for b in blocks)
    most_sinks = sink_share is not None and sink_share >= 0.5
    if patch_outliers or positional:
        absorbed, why = (
            False,
            "patches still carry high-norm outliers"
            + (" at fixed positions" if positional else ""),
        )
    elif sink_share is not None and not most_sinks:
        absorbed, why = False, f"only {sink_share:.0%} of sink events land on registers"
    elif high or most_sinks:
        parts = [f"registers reach >= {HIGH_NORM:g}x the median patch norm"] if high else []
        parts += [f"{sink_share:.0%} of sink events land on registers"] if most_sinks else []
        absorbed, why = True, "patches are clean; " + " and ".join(parts)
    else:
        absorbed, why = False, "no artifacts anywhere: registers carry nothing to absorb"
    return RegisterResult(n_reg, n_extra, blocks, sink_share, massive_share, absorbed, why)


class RegisterAnalysis(Analysis):
    """Register tokens as a group, after norms, sinks, massive and positions."""

    name = "registers"

    def reducers(self, model: Model) -> list[Reducer]:
        names = [n for n in model.hook_names() if n.endswith("attn.hook_pattern")]
        return [ReceivedAttention(n, model.site(n).layer) for n in names]

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Any]) -> RegisterResult:
        received = {r.layer: r.result() for r in trace.reducers if isinstance(r, ReceivedAttention)}
        norms = done.get("norms")
        layout = norms.trace.layouts[norms.trace.sites[-1]] if norms is not None else None
        return summarise(layout or model.layout, done, received)
