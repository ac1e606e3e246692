"""One verdict naming every kind of token artifact: present or not, where, and the evidence.

Built by ``diagnose`` from the other analyses of the same pass (norms, attention, sinks, massive activations,
LOF anomaly tokens, position-tied artifacts, registers); a kind whose analysis did not run or
does not apply is reported with ``present: None`` and the reason.
"""

from __future__ import annotations

from typing import TypeVar

from vitreg.analysis.base import Finished, summary_of
from vitreg.analysis.sinks import sink_heads
from vitreg.core.renamed import renamed
from vitreg.results.base import ResultsModel
from vitreg.results.diagnose import Attention, Norms
from vitreg.results.kinds import (
    LOF,
    AttentionEvidence,
    HighNormEvidence,
    KindEvidence,
    KindName,
    KindRow,
    Kinds,
    LOFEvidence,
    Massive,
    MassiveEvidence,
    NoEvidence,
    PositionEvidence,
    Positions,
    RegisterEvidence,
    Registers,
    SinkEvidence,
    Sinks,
)

# the robust z-score flags the tail of any map (a few per mille); artifacts are more than that
ATTENTION_RATE = 0.01


Done = dict[str, Finished]
T = TypeVar("T", bound=ResultsModel)


def _missing(kind: KindName, name: str, skipped: dict[str, str], source: str) -> KindRow:
    why = skipped.get(name, f"the {name} analysis did not run")
    return _row(kind, None, f"not analysed: {why}", NoEvidence(), source)


def _row(
    kind: KindName, present: bool | None, where: str, evidence: KindEvidence, source: str
) -> KindRow:
    return KindRow(kind=kind, present=present, where=where, evidence=evidence, source=source)


def _typed(done: Done, name: str, model: type[T]) -> T | None:
    """The results model of analysis ``name`` when it ran (else None)."""
    found = done.get(name)
    if found is None:
        return None
    summary = summary_of(found)
    if not isinstance(summary, model):
        raise TypeError(f"the {name} analysis gave {type(summary).__name__}, not {model.__name__}")
    return summary


def _cells(cells: list[list[int]]) -> str:
    return ", ".join(f"({r},{c})" for r, c in cells)


def high_norm(done: Done, skipped: dict[str, str]) -> KindRow:
    src = "Darcet et al. 2024 (ViTs need registers); vitreg's bimodal 'auto' rule"
    norms = _typed(done, "norms", Norms)
    if norms is None:
        return _missing("high-norm outliers", "norms", skipped, src)
    pos = _typed(done, "positions", Positions)
    found = norms.evidence.model_dump()
    if not norms.artifacts_present:
        ev = HighNormEvidence(**found)
        return _row("high-norm outliers", False, "no block has an outlier mode", ev, src)
    tied = pos is not None and pos.present
    ev = HighNormEvidence(
        **found, position_consistency=pos.consistency_score if pos is not None else None
    )
    where = (
        f"patches from block {norms.emergence_layer} on (clearest at block "
        f"{ev.strongest_layer}, {ev.outlier_rate:.1%} of patches); "
        + ("position-tied (see position-tied)" if tied else "content-tied: positions vary by image")
    )
    return _row("high-norm outliers", True, where, ev, src)


def attention(done: Done, skipped: dict[str, str]) -> KindRow:
    src = "[CLS]-attention outliers (Darcet et al. 2024), compared with the norm outliers"
    attn = _typed(done, "attention", Attention)
    if attn is None:
        return _missing("attention artifacts", "attention", skipped, src)
    last = attn.summary
    rate = float(last.artifact_rate)
    ev = AttentionEvidence(
        last_layer_artifact_rate=rate,
        presence_rate=ATTENTION_RATE,
        agreement_with_norms=last.agreement.model_dump(exclude_unset=True),
    )
    present = rate >= ATTENTION_RATE
    where = f"block {last.layer}: {rate:.1%} of patches" if present else "none"
    if 0 < rate < ATTENTION_RATE:
        where += f" ({rate:.2%} of patches flagged, below the {ATTENTION_RATE:.0%} presence rate)"
    return _row("attention artifacts", present, where, ev, src)


def sinks(done: Done, skipped: dict[str, str], cls: str) -> KindRow:
    kind: KindName = "NOP sinks" if cls == "NOP" else "broadcast sinks"
    src = (
        "vitreg's head rule (events in >= 50% of the images, majority class, block 0 included) "
        "on the Section-4 events of Fesser et al. 2026 (KempnerInstitute/attention_sink)"
    )
    res = _typed(done, "sinks", Sinks)
    if res is None:
        return _missing(kind, "sinks", skipped, src)
    key = "nop" if cls == "NOP" else "broadcast"
    heads = sink_heads(res, key)
    ev = SinkEvidence(
        per_image=getattr(res.per_image, key),
        heads=heads,
        transition_block=res.transition_block,
    )
    where = "; ".join(
        f"block {h.block} head {h.head} on {h.key_type}"
        + (f" {tuple(h.key_position)}" if h.key_position else "")
        + f" ({h.rate:.0%} of images)"
        for h in heads
    )
    return _row(kind, bool(heads), where or "none", ev, src)


def positions(done: Done, skipped: dict[str, str]) -> KindRow:
    src = "SigLIP edge patches (openpi #947, VisionZip #28), dinov2 #419; DVT-style constant inputs"
    res = _typed(done, "positions", Positions)
    if res is None:
        return _missing("position-tied", "positions", skipped, src)
    embedding = res.position_embedding
    ev = PositionEvidence(
        block=res.block,
        consistency_score=res.consistency_score,
        constant_images=res.constant_images,
        pos_embed_max_over_median=embedding.max_over_median if embedding is not None else None,
    )
    where = f"block {res.block}: {_cells(res.positions)}" if res.present else "none"
    return _row("position-tied", res.present, where, ev, src)


def massive(done: Done, skipped: dict[str, str]) -> KindRow:
    src = "Sun et al. 2024, Massive Activations in Large Language Models"
    res = _typed(done, "massive", Massive)
    if res is None:
        return _missing("massive activations", "massive", skipped, src)
    where = "; ".join(
        f"channel {c.channel} on {', '.join(c.token_types)} from block {min(c.blocks)}"
        for c in res.channels
    )
    ev = MassiveEvidence(
        first_block=res.first_block,
        on_high_norm_tokens=res.on_high_norm_tokens,
        channels=res.channels[:3],
    )
    return _row("massive activations", res.present, where or "none", ev, src)


def lof(done: Done, skipped: dict[str, str]) -> KindRow:
    src = "SC-CLIP (Bai et al. 2024): LocalOutlierFactor, k = 30, top 5%"
    res = _typed(done, "lof", LOF)
    if res is None:
        return _missing("LOF anomaly tokens", "lof", skipped, src)
    ev = LOFEvidence(
        strong_per_image=res.strong_per_image,
        strong_image_share=res.strong_image_share,
        max_score=res.max_score,
        agreement_with_auto=res.agreement_with_auto,
    )
    where = (
        f"{res.site}: {res.strong_per_image:.1f} strong anomalies per image"
        if res.present
        else "none"
    )
    return _row("LOF anomaly tokens", res.present, where, ev, src)


def registers(done: Done, skipped: dict[str, str]) -> KindRow:
    src = "Darcet et al. 2024; dinov2 PR #306, #390; dinov3 #119, #124"
    res = _typed(done, "registers", Registers)
    if res is None:
        return _missing("registers absorbed the artifacts", "registers", skipped, src)
    ev = RegisterEvidence(**res.model_dump(exclude={"blocks"}))
    return _row("registers absorbed the artifacts", res.absorbed, res.why, ev, src)


def verdicts(done: Done, skipped: dict[str, str] | None = None) -> Kinds:
    """Every kind, from the results of the analyses that ran (``skipped``: why others did not)."""
    s = skipped or {}
    rows = [
        high_norm(done, s),
        attention(done, s),
        sinks(done, s, "NOP"),
        sinks(done, s, "broadcast"),
        positions(done, s),
        massive(done, s),
        lof(done, s),
        registers(done, s),
    ]
    return Kinds(present=[k.kind for k in rows if k.present], kinds=rows)


__getattr__ = renamed(__name__, {"KindVerdict": "KindRow", "KindsResult": "Kinds"}, globals())
