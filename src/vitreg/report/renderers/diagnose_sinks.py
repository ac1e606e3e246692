"""The sink section's measures beside the Section-4 events: which rule each number follows, the
concentration ratio, the reference's own counts and head selection, and the masking control.
Results written before these measures hold none of them and get none of these blocks."""

from __future__ import annotations

from vitreg.report.render.markdown import Table, num, text
from vitreg.results.kinds import Sinks
from vitreg.results.sink_measures import (
    ClassCounts,
    Interval,
    ReferenceHead,
    SinkConcentration,
    SinkControl,
    SinkReferenceCounts,
)

Block = str | Table
TOP_HEADS = 5


def _which_rule(res: Sinks) -> str:
    return (
        "Which rule each number follows: the events per image and the head table above use the "
        "Section-4 rule (the Rule line; classes by the output-projected ratio and the stable "
        "rank, every block); the present/absent verdict is vitreg's own: a head with an event "
        f"in at least {res.head_rate_threshold:.0%} of the images, named by its majority class, "
        "block 0 included. The paper's tables count with another rule, shown below with "
        "Definition 1 and the reference's head selection."
    )


def _largest(conc: SinkConcentration, i: int, h: int) -> float | None:
    """The largest ratio of head ``h`` of the ``i``-th block listed (None: not in the file)."""
    row = conc.max[i] if i < len(conc.max) else []
    return row[h] if h < len(row) else None


def concentration_blocks(conc: SinkConcentration) -> list[Block]:
    # a hand-edited file may list fewer means or maxima than blocks: show what it holds
    pairs = [
        (v, i, h) for i, row in enumerate(conc.mean[: len(conc.blocks)]) for h, v in enumerate(row)
    ]
    top = sorted(pairs, reverse=True)[:TOP_HEADS]
    rows = [[text(conc.blocks[i]), text(h), num(v), num(_largest(conc, i, h))] for v, i, h in top]
    return [
        f"Concentration ratio ({text(conc.rule)}): largest {num(conc.peak)} at block "
        f"{text(conc.peak_block)} head {text(conc.peak_head)}; the heat map shows every head.",
        Table(["block", "head", "mean r", "max r"], rows),
    ]


def _count_row(label: str, where: str, c: ClassCounts) -> list[str]:
    e = c.events
    return [
        label,
        where,
        num(e.total),
        num(c.broadcast.total),
        num(c.nop.total),
        num(e.on_cls),
        num(e.on_register),
        num(e.on_patch),
    ]


def _heads(found: list[ReferenceHead]) -> str:
    return ", ".join(f"{h.block}.{h.head} ({h.n_events})" for h in found) or "none"


def reference_blocks(ref: SinkReferenceCounts) -> list[Block]:
    rows = []
    for r in ref.rules:
        label = "relaxed" if r.eps is None else f"Definition 1, eps {r.eps:g}"
        rows.append(_count_row(label, "blocks >= 1", r.from_block1))
        rows.append(_count_row(label, "block 0", r.block0))
    header = ["rule", "blocks", "events", "broadcast", "NOP", "on [CLS]", "on registers"]
    hs = ref.heads
    return [
        "Sink events per image as the paper's tables count them: events by the relaxed rule or "
        f"by Definition 1 (every query >= 1 - eps on the dominant key), classed by the "
        f"{ref.classes_by}; the tables sum blocks >= 1, block 0 is shown apart.",
        Table([*header, "on patches"], rows),
        f"The reference's head selection (Section-4 classes; a head needs >= {hs.min_events} "
        f"events of the class; top {hs.k_deep} of blocks >= 1, top {hs.k_block0} of block 0; "
        "block.head (events)): NOP "
        f"{_heads(hs.nop)}; broadcast {_heads(hs.broadcast)}; block 0 NOP "
        f"{_heads(hs.nop_block0)}; block 0 broadcast {_heads(hs.broadcast_block0)}.",
    ]


def _iv(i: Interval) -> str:
    return f"{num(i.mean)} [{num(i.low)}, {num(i.high)}]"


def control_blocks(c: SinkControl) -> list[Block]:
    out: list[Block] = [f"Masking control: {text(c.method)}. Measure: {text(c.measure)}."]
    out += [f"Note: {n}" for n in c.notes]
    paths = [("score", c.score), ("value", c.value)]
    rows = [
        [name, _iv(p.sink), _iv(p.random), _iv(p.difference), num(p.ratio)]
        for name, p in paths
        if p is not None
    ]
    if rows:
        heads = ", ".join(f"{b}.{h}" for b, h in c.heads)
        out.append(f"Edited heads (block.head): {heads}; {text(c.n_images)} images, seed {c.seed}.")
        out.append(Table(["path", "sink keys", "random keys", "sink - random", "ratio"], rows))
    return out


def measure_blocks(res: Sinks) -> list[Block]:
    """The blocks of whichever measures ``res`` holds (none for older results)."""
    out: list[Block] = []
    if res.reference_counts is not None:
        out.append(_which_rule(res))
    if res.concentration is not None:
        out += concentration_blocks(res.concentration)
    if res.reference_counts is not None:
        out += reference_blocks(res.reference_counts)
    if res.control is not None:
        out += control_blocks(res.control)
    return out
