"""The sink / dead / alive part of a ``vitreg vlm`` run: stacked bars per language-model site
without and with the fix, a table of the counts, the anchors and the rule, its headlines."""

from __future__ import annotations

from vitreg.report.document import Headline
from vitreg.report.render.markdown import Section, Table, code, num, pct, text
from vitreg.report.render.plots import Figure, figure, new_canvas, outside_legend, tidy
from vitreg.results.vlm import SiteSplit, VlmTaxonomy

COLOURS = {"sink": "C3", "dead": "0.6", "alive": "C2"}
MEANING = (
    "**What the split means** (EmbedLens, Fan et al. 2026, arXiv 2603.00510). Each image token "
    "the language model reads is compared, by cosine, with every row of its input-embedding "
    "matrix; of its {k} nearest vocabulary tokens, one sink anchor makes it a *sink* (it aligns "
    "with a recurring sink direction), else one dead anchor makes it *dead* (it carries no "
    "image-specific content), else it is *alive*. The paper finds about 60% of LLaVA-1.5-7B's "
    "image tokens alive at the input. The same rule is applied to the hidden states after the "
    "chosen decoder layers, and to the tokens the fixed tower gives, with the same anchors."
)


def taxonomy_headlines() -> list[Headline]:
    """The alive and sink shares at the language model's input, without and with the fix."""
    return [
        Headline(
            f"vlm.{what}_input_{side}",
            f"/results/taxonomy/{side}/0/{what}",
            None,
            f"{what} image tokens at the language model's input, {side}",
            unit="fraction" if what == "alive_share" else "tokens",
        )
        for what in ("alive_share", "sink")
        for side in ("before", "after")
    ]


def taxonomy_figure(tax: VlmTaxonomy) -> Figure:
    """Stacked bars of the three classes' shares per site, without and with the fix."""
    fig = new_canvas(max(4.0, 1.4 * len(tax.before) + 2.0), 3.2)
    ax = fig.subplots()
    labels, bars = [], []
    for before, after in tax.pairs():
        for side, part in (("before", before), ("after", after)):
            if part is not None:
                labels.append(f"{part.site}\n{side}")
                bars.append(part)
    x = list(range(len(bars)))
    bottom = [0.0] * len(bars)
    for name, colour in COLOURS.items():
        shares = [getattr(p, name) / p.n_tokens if p.n_tokens else 0.0 for p in bars]
        ax.bar(x, shares, bottom=bottom, color=colour, label=name, width=0.7)
        bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of image tokens")
    outside_legend(ax)
    tidy(fig)
    caption = (
        "Sink / dead / alive shares of the image tokens (all images) at the language model's "
        "input and after each chosen decoder layer, without (before) and with (after) the fix "
        f"(k = {tax.k} nearest vocabulary tokens)."
    )
    return figure("vlm_taxonomy", caption, fig)


def _row(side: str, p: SiteSplit | None) -> list[str]:
    if p is None:
        return ["–", side, "–", "–", "–", "–"]
    return [text(p.site), side, num(p.sink), num(p.dead), num(p.alive), pct(p.alive_share)]


def _ids(ids: list[int], tokens: list[str]) -> str:
    shown = [f"{i} {code(t)}" for i, t in zip(ids, tokens, strict=True)] if tokens else ids
    return ", ".join(map(str, shown)) or "none"


def taxonomy_section(tax: VlmTaxonomy) -> Section:
    """The counts per site and condition, the anchors and what the split means."""
    rows = []
    for before, after in tax.pairs():
        rows += [_row("before", before), _row("after", after)]
    table = Table(["site", "fix", "sink", "dead", "alive", "alive share"], rows)
    a = tax.anchors
    anchors = (
        f"Sink anchors: {_ids(a.sink_ids, a.sink_tokens)} ({text(a.sink_source)}). Dead anchors: "
        f"{_ids(a.dead_ids, a.dead_tokens)} ({text(a.dead_source)}). Rule: {text(tax.rule)}."
    )
    return Section(
        "taxonomy", "Sink / dead / alive image tokens", [table, anchors, MEANING.format(k=tax.k)]
    )
