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

import torch

from vitreg.analysis.base import Analysis, Finished
from vitreg.analysis.massive import HIGH_NORM
from vitreg.analysis.norms import NormsResult
from vitreg.core.layout import TokenLayout
from vitreg.core.renamed import renamed
from vitreg.hooks.reducers import Reducer, type_index
from vitreg.hooks.sites import HookContext
from vitreg.hooks.streamed import column_mean
from vitreg.models.model import Model, TraceResult
from vitreg.results.kinds import Massive, Positions, RegisterBlock, Registers, Sinks

GROUPS = ("cls", "register", "extra", "patch")


class ReceivedAttention(Reducer[dict[str, float]]):
    """Attention mass each token type receives (mean over queries, heads and images), by type
    ("cls", "register", "extra", "patch")."""

    def __init__(self, site: str, layer: int) -> None:
        super().__init__(site)
        self.layer = layer
        self.sums: dict[str, float] = {}
        self.count = 0

    streams_patterns = True
    reads_pattern_columns = True

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        received = column_mean(t)  # [B, H, N_k]: mean over queries
        for kind, sl in type_index(ctx, received.shape[-1]).items():
            self.sums[kind] = self.sums.get(kind, 0.0) + float(received[..., sl].sum(-1).sum())
        self.count += received.shape[0] * received.shape[1]

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, ReceivedAttention)
        for k, v in other.sums.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.count += other.count
        self.n_images = max(self.n_images, other.n_images)

    def result(self) -> dict[str, float]:
        return {k: v / max(self.count, 1) for k, v in self.sums.items()}


RULE = (
    f"absorbed: no patch outlier mode, no position-tied outliers, and registers at >= "
    f"{HIGH_NORM:g}x the median patch norm in some block or holding most sink events"
)


def _group_norms(norms: NormsResult, received: dict[int, dict[str, float]]) -> list[RegisterBlock]:
    """Median token norm of each group at every block output, and the attention it receives."""
    out = []
    for i, site in enumerate(norms.trace.sites):
        lay, tn = norms.trace.layouts[site], norms.trace.norms[site]
        parts = {
            "cls": lay.cls,
            "register": lay.registers,
            "extra": lay.extra,
            "patch": lay.patches,
        }
        med = {k: float(tn[:, sl].median()) for k, sl in parts.items() if sl.stop > sl.start}
        top = max((med[k] for k in ("register", "extra") if k in med), default=None)
        out.append(
            RegisterBlock(
                block=i,
                cls_norm=med.get("cls"),
                register_norm=med.get("register"),
                extra_norm=med.get("extra"),
                patch_norm=med["patch"],
                register_over_patch=top / max(med["patch"], 1e-12) if top else None,
                attention_share=received.get(i, {}),
            )
        )
    return out


def summarise(
    layout: TokenLayout, done: dict[str, Finished], received: dict[int, dict[str, float]]
) -> Registers:
    """The register group and the verdict, from the earlier analyses' results."""
    n_reg, n_extra = layout.n_reg, layout.n_extra
    norms, sinks = done.get("norms"), done.get("sinks")
    massive, positions = done.get("massive"), done.get("positions")
    norms = norms if isinstance(norms, NormsResult) else None
    blocks = _group_norms(norms, received) if norms is not None else []
    sink_share = None
    if isinstance(sinks, Sinks) and sinks.per_image.total:
        on = sinks.per_image.on_register + sinks.per_image.on_extra
        sink_share = on / sinks.per_image.total
    massive_share = None
    if isinstance(massive, Massive) and massive.channels:
        types = [ch.token_types for ch in massive.channels]
        total = sum(sum(t.values()) for t in types)
        massive_share = sum(t.get("register", 0) + t.get("extra", 0) for t in types) / total
    if n_reg + n_extra == 0:
        return _registers(0, 0, blocks, None, None, None, "the model has no register tokens")
    patch_outliers = bool(norms is not None and norms.summary.artifacts_present)
    positional = bool(isinstance(positions, Positions) and positions.present)
    high = any((b.register_over_patch or 0) >= HIGH_NORM for b in blocks)
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
    return _registers(n_reg, n_extra, blocks, sink_share, massive_share, absorbed, why)


def _registers(
    n_registers: int,
    n_extra: int,
    blocks: list[RegisterBlock],
    sink_share: float | None,
    massive_share: float | None,
    absorbed: bool | None,
    why: str,
) -> Registers:
    top = max((b.register_over_patch for b in blocks if b.register_over_patch), default=None)
    return Registers(
        n_registers=n_registers,
        n_extra=n_extra,
        absorbed=absorbed,
        why=why,
        sink_share=sink_share,
        massive_share=massive_share,
        register_over_patch_norm_max=top,
        rule=RULE,
        blocks=blocks,
    )


class RegisterAnalysis(Analysis):
    """Register tokens as a group, after norms, sinks, massive and positions."""

    name = "registers"

    def reducers(self, model: Model) -> list[Reducer]:
        names = [n for n in model.hook_names() if n.endswith("attn.hook_pattern")]
        return [ReceivedAttention(n, model.site(n).layer) for n in names]

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> Registers:
        received = {r.layer: r.result() for r in trace.reducers if isinstance(r, ReceivedAttention)}
        norms = done.get("norms")
        layout = (
            norms.trace.layouts[norms.trace.sites[-1]] if isinstance(norms, NormsResult) else None
        )
        return summarise(layout or model.layout, done, received)


__getattr__ = renamed(__name__, {"RegisterResult": "Registers"}, globals())
