"""Report sections of the per-kind analyses: the per-kind verdict (the report's first section)
and one section each for sinks, massive activations, LOF anomaly tokens, position-tied artifacts
and register tokens, read from the typed diagnose results
(:class:`~vitreg.results.diagnose.DiagnoseResults`): an analysis that did not run is
``None`` there and a "not analysed" line here."""

from __future__ import annotations

from collections.abc import Iterable

from vitreg.report.render.markdown import Section, Table, code, num, pct, text
from vitreg.report.renderers.diagnose_sinks import measure_blocks
from vitreg.results.diagnose import DiagnoseResults


def _missing(r: DiagnoseResults, s: Section, name: str) -> Section:
    why = r.not_applicable.get(name)
    s.blocks.append(f"Not analysed: {why}." if why else f"The {name} analysis did not run.")
    return s


def _cells(cells: Iterable[list[int]]) -> str:
    """Patch positions as ``(row,col)`` pairs, comma-separated."""
    return ", ".join(f"({r},{c})" for r, c in cells)


def kinds_section(r: DiagnoseResults) -> Section:
    """Every kind of token artifact: present or not, where, and the source of its rule."""
    s = Section("kinds", "Artifact kinds")
    kinds = r.kinds
    if kinds is None:
        return _missing(r, s, "kinds")
    rows = []
    for k in kinds.kinds:
        mark = "not analysed" if k.present is None else ("**yes**" if k.present else "no")
        rows.append([text(k.kind), mark, text(k.where), text(k.source)])
    found = kinds.present
    s.blocks.append(
        f"Found: {', '.join(map(str, found))}." if found else "No kind of token artifact found."
    )
    s.blocks.append(Table(["kind", "present", "where", "rule from"], rows))
    return s


def sinks_section(r: DiagnoseResults) -> Section:
    s = Section("sinks", "Attention sinks (NOP / broadcast)")
    res = r.sinks
    if res is None:
        return _missing(r, s, "sinks")
    per = res.per_image
    s.blocks.append(f"Rule: {text(res.rule)}.")
    s.blocks.append(
        f"Sink events per image: {num(per.total)} (NOP {num(per.nop)}, "
        f"broadcast {num(per.broadcast)}; on [CLS] {num(per.on_cls)}, on "
        f"registers {num(per.on_register)}, on patches {num(per.on_patch)}). "
        f"Sinks move from [CLS] to patches at block {text(res.transition_block)}."
    )
    if res.heads:
        rows = [
            [
                text(h.block),
                text(h.head),
                text(h.kind),
                text(h.key_type) + (f" {h.key_position}" if h.key_position else ""),
                pct(h.rate),
                num(h.ratio),
                num(h.stable_rank),
            ]
            for h in res.heads
        ]
        header = ["block", "head", "class", "key", "images", "value ratio", "stable rank"]
        s.blocks.append(Table(header, rows))
    else:
        s.blocks.append(f"No head sinks in {pct(res.head_rate_threshold)} of the images.")
    s.blocks += measure_blocks(res)
    return s


def massive_section(r: DiagnoseResults) -> Section:
    s = Section("massive", "Massive activations")
    res = r.massive
    if res is None:
        return _missing(r, s, "massive")
    s.blocks.append(f"Rule: {text(res.rule)}.")
    if not res.channels:
        s.blocks.append("No massive activation in any block.")
        return s
    s.blocks.append(
        f"From block {text(res.first_block)}; {pct(res.on_high_norm_tokens)} of "
        f"the massive entries sit on high-norm tokens ({text(res.high_norm_rule)}); "
        f"{pct(res.auto_outliers_with_massive)} of the auto norm outliers carry one."
    )
    rows = [
        [
            text(c.channel),
            ", ".join(map(str, c.blocks)),
            ", ".join(f"{k} {v}" for k, v in c.token_types.items()),
            num(c.hits_per_image),
            num(c.max_value),
            num(c.max_over_median),
        ]
        for c in res.channels
    ]
    header = ["channel", "blocks", "tokens", "hits/image", "max |value|", "max / median"]
    s.blocks.append(Table(header, rows))
    return s


def lof_section(r: DiagnoseResults) -> Section:
    s = Section("lof", "LOF anomaly tokens")
    res = r.lof
    if res is None:
        return _missing(r, s, "lof")
    agree = res.agreement_with_auto
    s.blocks.append(f"Rule: {text(res.rule)}.")
    s.blocks.append(
        f"At {code(res.site)} over {text(res.n_images)} images: "
        f"{num(res.strong_per_image)} strong anomalies per image, in "
        f"{pct(res.strong_image_share)} of the images (largest LOF score "
        f"{num(res.max_score)}). Against the auto norm outliers: precision "
        f"{num(agree.precision)}, recall {num(agree.recall)}, Jaccard "
        f"{num(agree.jaccard)}."
    )
    s.blocks += [f"Note: {n}" for n in res.notes]
    return s


def positions_section(r: DiagnoseResults) -> Section:
    s = Section("positions", "Position-tied artifacts")
    res = r.positions
    if res is None:
        return _missing(r, s, "positions")
    s.blocks.append(f"Rule: {text(res.rule)}.")
    s.blocks.append(
        f"Block {text(res.block)}: consistent positions {_cells(res.positions) or 'none'}; "
        f"position-consistency score {num(res.consistency_score)}. Constant images: "
        + (
            "; ".join(f"{k}: {_cells(v) or 'none'}" for k, v in res.constant_images.items())
            or "not run (no consistent positions)"
        )
        + "."
    )
    pos = res.position_embedding
    if pos is not None:
        s.blocks.append(
            f"Position embedding: max/median norm {num(pos.max_over_median)}; positions "
            f"at >= 3x the median: {_cells(pos.high_positions) or 'none'}"
            f"; largest channel's share of their norm {pct(pos.top_channel_share_of_high)}."
        )
    s.blocks += [f"Note: {n}" for n in res.notes]
    return s


def registers_section(r: DiagnoseResults) -> Section:
    s = Section("registers", "Register tokens")
    res = r.registers
    if res is None:
        return _missing(r, s, "registers")
    if res.absorbed is None:
        s.blocks.append("The model has no register tokens.")
        return s
    verdict = "absorbed" if res.absorbed else "did not absorb"
    s.blocks.append(
        f"{text(res.n_registers)} registers, {text(res.n_extra)} inserted: they "
        f"**{verdict}** the artifacts ({text(res.why)}). Share of sink events on "
        f"registers: {pct(res.sink_share)}; of massive entries: "
        f"{pct(res.massive_share)}. Rule: {text(res.rule)}."
    )
    rows = []
    for b in res.blocks:
        share = b.attention_share
        rows.append(
            [
                text(b.block),
                num(b.register_norm if b.register_norm is not None else b.extra_norm),
                num(b.patch_norm),
                num(b.cls_norm),
                pct(share.get("register", share.get("extra"))),
                pct(share.get("patch")),
            ]
        )
    header = [
        "block",
        "register norm",
        "patch norm",
        "[CLS] norm",
        "attn to registers",
        "to patches",
    ]
    s.blocks.append(Table(header, rows))
    return s


def detail_sections(r: DiagnoseResults) -> list[Section]:
    """The per-kind sections (sinks, NOP/broadcast, attention artifacts, ...) after the established ones."""
    return [
        sinks_section(r),
        massive_section(r),
        lof_section(r),
        positions_section(r),
        registers_section(r),
    ]
