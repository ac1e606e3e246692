"""One verdict naming every kind of token artifact: present or not, where, and the evidence.

Built by ``diagnose`` from the other analyses of the same pass (norms, attention, sinks, massive activations,
LOF anomaly tokens, position-tied artifacts, registers); a kind whose analysis did not run or
does not apply is reported with ``present: None`` and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the robust z-score flags the tail of any map (a few per mille); artifacts are more than that
ATTENTION_RATE = 0.01


@dataclass
class KindVerdict:
    """One kind: present (None: not analysed), where, evidence and the source of its rule."""

    kind: str
    present: bool | None
    where: str
    evidence: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class KindsResult:
    """Every kind's verdict, in the report's order."""

    kinds: list[KindVerdict]

    def get(self, kind: str) -> KindVerdict:
        return next(k for k in self.kinds if k.kind == kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "present": [k.kind for k in self.kinds if k.present],
            "kinds": [k.to_dict() for k in self.kinds],
        }


def _missing(kind: str, name: str, skipped: dict[str, str], source: str) -> KindVerdict:
    why = skipped.get(name, f"the {name} analysis did not run")
    return KindVerdict(kind, None, f"not analysed: {why}", {}, source)


def _cells(cells: list[list[int]]) -> str:
    return ", ".join(f"({r},{c})" for r, c in cells)


def high_norm(done: dict[str, Any], skipped: dict[str, str]) -> KindVerdict:
    src = "Darcet et al. 2024 (ViTs need registers); vitreg's bimodal 'auto' rule"
    norms = done.get("norms")
    if norms is None:
        return _missing("high-norm outliers", "norms", skipped, src)
    rep, pos = norms.report, done.get("positions")
    ev = dict(rep.evidence)
    if not rep.verdict:
        return KindVerdict("high-norm outliers", False, "no block has an outlier mode", ev, src)
    tied = pos is not None and pos.present
    ev["position_consistency"] = pos.score if pos is not None else None
    where = (
        f"patches from block {rep.emergence_layer} on (clearest at block "
        f"{ev.get('strongest_layer')}, {ev.get('outlier_rate', 0):.1%} of patches); "
        + ("position-tied (see position-tied)" if tied else "content-tied: positions vary by image")
    )
    return KindVerdict("high-norm outliers", True, where, ev, src)


def attention(done: dict[str, Any], skipped: dict[str, str]) -> KindVerdict:
    src = "[CLS]-attention outliers (Darcet et al. 2024), compared with the norm outliers"
    attn = done.get("attention")
    if attn is None:
        return _missing("attention artifacts", "attention", skipped, src)
    summary = attn.summary()
    rate = float(summary["artifact_rate"])
    ev = {
        "last_layer_artifact_rate": rate,
        "presence_rate": ATTENTION_RATE,
        "agreement_with_norms": summary["agreement"],
    }
    present = rate >= ATTENTION_RATE
    where = f"block {summary['layer']}: {rate:.1%} of patches" if present else "none"
    if 0 < rate < ATTENTION_RATE:
        where += f" ({rate:.2%} of patches flagged, below the {ATTENTION_RATE:.0%} presence rate)"
    return KindVerdict("attention artifacts", present, where, ev, src)


def sinks(done: dict[str, Any], skipped: dict[str, str], cls: str) -> KindVerdict:
    kind = f"{cls} sinks"
    src = "Fesser et al. 2026, A Unifying View of Attention Sinks (KempnerInstitute/attention_sink)"
    res = done.get("sinks")
    if res is None:
        return _missing(kind, "sinks", skipped, src)
    heads = res.kinds_present()["nop" if cls == "NOP" else "broadcast"]
    key = "nop" if cls == "NOP" else "broadcast"
    ev = {
        "per_image": res.per_image.get(key, 0.0),
        "heads": [h.to_dict() for h in heads],
        "transition_block": res.transition_block,
    }
    where = "; ".join(
        f"block {h.block} head {h.head} on {h.key_type}"
        + (f" {tuple(h.key_position)}" if h.key_position else "")
        + f" ({h.rate:.0%} of images)"
        for h in heads
    )
    return KindVerdict(kind, bool(heads), where or "none", ev, src)


def positions(done: dict[str, Any], skipped: dict[str, str]) -> KindVerdict:
    src = "SigLIP edge patches (openpi #947, VisionZip #28), dinov2 #419; DVT-style constant inputs"
    res = done.get("positions")
    if res is None:
        return _missing("position-tied", "positions", skipped, src)
    ev = {
        "block": res.block,
        "consistency_score": res.score,
        "constant_images": res.constant_positions,
        "pos_embed_max_over_median": (res.pos_embed or {}).get("max_over_median"),
    }
    where = f"block {res.block}: {_cells(res.positions)}" if res.present else "none"
    return KindVerdict("position-tied", res.present, where, ev, src)


def massive(done: dict[str, Any], skipped: dict[str, str]) -> KindVerdict:
    src = "Sun et al. 2024, Massive Activations in Large Language Models"
    res = done.get("massive")
    if res is None:
        return _missing("massive activations", "massive", skipped, src)
    where = "; ".join(
        f"channel {c.channel} on {', '.join(c.token_types)} from block {min(c.blocks)}"
        for c in res.channels
    )
    ev = {"first_block": res.first_block, "on_high_norm_tokens": res.on_high_norm}
    ev["channels"] = [c.to_dict() for c in res.channels[:3]]
    return KindVerdict("massive activations", res.present, where or "none", ev, src)


def lof(done: dict[str, Any], skipped: dict[str, str]) -> KindVerdict:
    src = "SC-CLIP (Bai et al. 2024): LocalOutlierFactor, k = 30, top 5%"
    res = done.get("lof")
    if res is None:
        return _missing("LOF anomaly tokens", "lof", skipped, src)
    ev = {
        "strong_per_image": res.strong_per_image,
        "strong_image_share": res.strong_image_share,
        "max_score": res.max_score,
        "agreement_with_auto": res.agreement,
    }
    where = (
        f"{res.site}: {res.strong_per_image:.1f} strong anomalies per image"
        if res.present
        else "none"
    )
    return KindVerdict("LOF anomaly tokens", res.present, where, ev, src)


def registers(done: dict[str, Any], skipped: dict[str, str]) -> KindVerdict:
    src = "Darcet et al. 2024; dinov2 PR #306, #390; dinov3 #119, #124"
    res = done.get("registers")
    if res is None:
        return _missing("registers absorbed the artifacts", "registers", skipped, src)
    ev = {k: v for k, v in res.to_dict().items() if k != "blocks"}
    return KindVerdict("registers absorbed the artifacts", res.absorbed, res.why, ev, src)


def verdicts(done: dict[str, Any], skipped: dict[str, str] | None = None) -> KindsResult:
    """Every kind, from the results of the analyses that ran (``skipped``: why others did not)."""
    s = skipped or {}
    return KindsResult(
        [
            high_norm(done, s),
            attention(done, s),
            sinks(done, s, "NOP"),
            sinks(done, s, "broadcast"),
            positions(done, s),
            massive(done, s),
            lof(done, s),
            registers(done, s),
        ]
    )
