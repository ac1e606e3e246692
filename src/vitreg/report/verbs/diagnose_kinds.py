"""Report sections of the issue-20 analyses: the per-kind verdict (the report's first section)
and one section each for sinks, massive activations, LOF anomaly tokens, position-tied artifacts
and register tokens, all read from the metrics.json document's ``results``."""

from __future__ import annotations

from typing import Any

from vitreg.report.fields import as_dict, as_list, dig
from vitreg.report.render.markdown import Section, Table, code, num, pct, text


def _block(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    found = dig(doc, "results", name)
    return found if isinstance(found, dict) and found else None


def _missing(doc: dict[str, Any], s: Section, name: str) -> Section:
    why = dig(doc, "results", "not_applicable", name)
    s.blocks.append(f"Not analysed: {why}." if why else f"The {name} analysis did not run.")
    return s


def kinds_section(doc: dict[str, Any]) -> Section:
    """Every kind of token artifact: present or not, where, and the source of its rule."""
    s = Section("kinds", "Artifact kinds")
    kinds = _block(doc, "kinds")
    if kinds is None:
        return _missing(doc, s, "kinds")
    rows = []
    for k in as_list(kinds.get("kinds")):
        k = as_dict(k)
        present = k.get("present")
        mark = "not analysed" if present is None else ("**yes**" if present else "no")
        rows.append([text(k.get("kind")), mark, text(k.get("where")), text(k.get("source"))])
    found = as_list(kinds.get("present"))
    s.blocks.append(
        f"Found: {', '.join(map(str, found))}." if found else "No kind of token artifact found."
    )
    s.blocks.append(Table(["kind", "present", "where", "rule from"], rows))
    return s


def sinks_section(doc: dict[str, Any]) -> Section:
    s = Section("sinks", "Attention sinks (NOP / broadcast)")
    res = _block(doc, "sinks")
    if res is None:
        return _missing(doc, s, "sinks")
    per = as_dict(res.get("per_image"))
    s.blocks.append(f"Rule: {text(res.get('rule'))}.")
    s.blocks.append(
        f"Sink events per image: {num(per.get('total', 0))} (NOP {num(per.get('nop', 0))}, "
        f"broadcast {num(per.get('broadcast', 0))}; on [CLS] {num(per.get('on_cls', 0))}, on "
        f"registers {num(per.get('on_register', 0))}, on patches {num(per.get('on_patch', 0))}). "
        f"Sinks move from [CLS] to patches at block {text(res.get('transition_block'))}."
    )
    heads = [as_dict(h) for h in as_list(res.get("heads"))]
    if heads:
        rows = [
            [
                text(h.get("block")),
                text(h.get("head")),
                text(h.get("kind")),
                text(h.get("key_type"))
                + (f" {h['key_position']}" if h.get("key_position") else ""),
                pct(h.get("rate")),
                num(h.get("ratio")),
                num(h.get("stable_rank")),
            ]
            for h in heads
        ]
        header = ["block", "head", "class", "key", "images", "value ratio", "stable rank"]
        s.blocks.append(Table(header, rows))
    else:
        s.blocks.append(f"No head sinks in {pct(res.get('head_rate_threshold'))} of the images.")
    return s


def massive_section(doc: dict[str, Any]) -> Section:
    s = Section("massive", "Massive activations")
    res = _block(doc, "massive")
    if res is None:
        return _missing(doc, s, "massive")
    s.blocks.append(f"Rule: {text(res.get('rule'))}.")
    channels = [as_dict(c) for c in as_list(res.get("channels"))]
    if not channels:
        s.blocks.append("No massive activation in any block.")
        return s
    s.blocks.append(
        f"From block {text(res.get('first_block'))}; {pct(res.get('on_high_norm_tokens'))} of "
        f"the massive entries sit on high-norm tokens ({text(res.get('high_norm_rule'))}); "
        f"{pct(res.get('auto_outliers_with_massive'))} of the auto norm outliers carry one."
    )
    rows = [
        [
            text(c.get("channel")),
            ", ".join(map(str, as_list(c.get("blocks")))),
            ", ".join(f"{k} {v}" for k, v in as_dict(c.get("token_types")).items()),
            num(c.get("hits_per_image")),
            num(c.get("max_value")),
            num(c.get("max_over_median")),
        ]
        for c in channels
    ]
    header = ["channel", "blocks", "tokens", "hits/image", "max |value|", "max / median"]
    s.blocks.append(Table(header, rows))
    return s


def lof_section(doc: dict[str, Any]) -> Section:
    s = Section("lof", "LOF anomaly tokens")
    res = _block(doc, "lof")
    if res is None:
        return _missing(doc, s, "lof")
    agree = as_dict(res.get("agreement_with_auto"))
    s.blocks.append(f"Rule: {text(res.get('rule'))}.")
    s.blocks.append(
        f"At {code(res.get('site'))} over {text(res.get('n_images'))} images: "
        f"{num(res.get('strong_per_image'))} strong anomalies per image, in "
        f"{pct(res.get('strong_image_share'))} of the images (largest LOF score "
        f"{num(res.get('max_score'))}). Against the auto norm outliers: precision "
        f"{num(agree.get('precision'))}, recall {num(agree.get('recall'))}, Jaccard "
        f"{num(agree.get('jaccard'))}."
    )
    s.blocks += [f"Note: {n}" for n in as_list(res.get("notes"))]
    return s


def positions_section(doc: dict[str, Any]) -> Section:
    s = Section("positions", "Position-tied artifacts")
    res = _block(doc, "positions")
    if res is None:
        return _missing(doc, s, "positions")
    s.blocks.append(f"Rule: {text(res.get('rule'))}.")
    cells = ", ".join(f"({r},{c})" for r, c in as_list(res.get("positions")))
    s.blocks.append(
        f"Block {text(res.get('block'))}: consistent positions {cells or 'none'}; "
        f"position-consistency score {num(res.get('consistency_score'))}. Constant images: "
        + (
            "; ".join(
                f"{k}: {', '.join(f'({r},{c})' for r, c in v) or 'none'}"
                for k, v in as_dict(res.get("constant_images")).items()
            )
            or "not run (no consistent positions)"
        )
        + "."
    )
    pos = as_dict(res.get("position_embedding"))
    if pos:
        s.blocks.append(
            f"Position embedding: max/median norm {num(pos.get('max_over_median'))}; positions "
            f"at >= 3x the median: "
            f"{', '.join(f'({r},{c})' for r, c in as_list(pos.get('high_positions'))) or 'none'}"
            f"; largest channel's share of their norm {pct(pos.get('top_channel_share_of_high'))}."
        )
    s.blocks += [f"Note: {n}" for n in as_list(res.get("notes"))]
    return s


def registers_section(doc: dict[str, Any]) -> Section:
    s = Section("registers", "Register tokens")
    res = _block(doc, "registers")
    if res is None:
        return _missing(doc, s, "registers")
    if res.get("absorbed") is None:
        s.blocks.append("The model has no register tokens.")
        return s
    verdict = "absorbed" if res.get("absorbed") else "did not absorb"
    s.blocks.append(
        f"{text(res.get('n_registers'))} registers, {text(res.get('n_extra'))} inserted: they "
        f"**{verdict}** the artifacts ({text(res.get('why'))}). Share of sink events on "
        f"registers: {pct(res.get('sink_share'))}; of massive entries: "
        f"{pct(res.get('massive_share'))}. Rule: {text(res.get('rule'))}."
    )
    rows = []
    for b in as_list(res.get("blocks")):
        b = as_dict(b)
        share = as_dict(b.get("attention_share"))
        rows.append(
            [
                text(b.get("block")),
                num(b.get("register_norm", b.get("extra_norm"))),
                num(b.get("patch_norm")),
                num(b.get("cls_norm")),
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


def detail_sections(doc: dict[str, Any]) -> list[Section]:
    """The issue-20 sections after the established ones."""
    return [
        sinks_section(doc),
        massive_section(doc),
        lof_section(doc),
        positions_section(doc),
        registers_section(doc),
    ]
