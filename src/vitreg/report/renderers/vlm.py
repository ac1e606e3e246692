"""Run directory of ``vitreg vlm``: per image, the tower's feature-norm map and the language
model's attention over the image tokens, before and after the fix, side by side; the answers
before and after and how much they changed; traceable headlines in metrics.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitreg.report.document import Headline, build_document
from vitreg.report.render.envelope import (
    data_section,
    model_section,
    provenance_section,
    synthetic_banner,
)
from vitreg.report.render.markdown import (
    FigureRef,
    Report,
    Section,
    Table,
    code,
    figure_section,
    num,
    pct,
    text,
)
from vitreg.report.render.plots import CLIP_TEXT, MAX_ROWS, Figure, overlay_grid, png_bytes
from vitreg.report.renderers.vlm_taxonomy import (
    taxonomy_figure,
    taxonomy_headlines,
    taxonomy_section,
)
from vitreg.report.writer import write_run
from vitreg.results.fix import NamedFix, TtrDescription
from vitreg.results.schema import DataInfo, Envelope, ModelInfo
from vitreg.results.vlm import Condition, VlmImage, VlmResults
from vitreg.settings.base import ConfigFile

SUMMARY = (
    ("identical_rate", "answers identical", True, "fraction"),
    ("edit_distance_normalized", "token edit distance / longer answer", False, "fraction"),
    ("first_token_kl", "KL(before || after), first answer token", False, "nats"),
    ("same_first_token_rate", "same most likely first token", True, "fraction"),
    ("attention_on_outliers_before", "attention on outlier patches, before", None, "fraction"),
    ("attention_on_outliers_after", "attention on outlier patches, after", False, "fraction"),
    ("max_over_median_before", "max/median patch norm (tower), before", None, None),
    ("max_over_median_after", "max/median patch norm (tower), after", False, None),
    ("image_attention_mass_before", "attention mass on image tokens, before", None, "fraction"),
    ("image_attention_mass_after", "attention mass on image tokens, after", None, "fraction"),
)
MEANING = (
    "**What the maps show.** *feature norm*: the L2 norm of each patch token at the tower layer "
    "LLaVA feeds its projector (`{site}`); high-norm outliers are the artifacts test-time "
    "registers move into the extra token. *LM→image attention*: the attention the language "
    "model's text rows ({query}) put on each image token, averaged over heads, rows and all "
    "language-model layers, drawn on the patch grid; outlier spikes there are attention the "
    "answer spends on artifact tokens rather than on image content. Each column has its own "
    f"colour scale ({CLIP_TEXT})."
)
QUERY_TEXT = {
    "answer": "the rows that generated each answer token; the last prompt token generated the first",
    "last": "the last prompt token",
}


def headlines(results: VlmResults) -> list[Headline]:
    """One headline per summary number, and the input's split when the run has one."""
    found = [
        Headline(f"vlm.{key}", f"/results/summary/{key}", better, label, unit=unit)
        for key, label, better, unit in SUMMARY
    ]
    return found + (taxonomy_headlines() if results.taxonomy is not None else [])


def _query(results: VlmResults) -> str:
    q = results.query
    return QUERY_TEXT.get(q, str(q)) if isinstance(q, str) else f"positions {q}"


def map_figures(results: VlmResults, images: np.ndarray | None) -> list[Figure]:
    """Up to MAX_ROWS images per figure: norm and attention maps, before and after, side by side."""
    rows = results.images
    figs = []
    for start in range(0, len(rows), MAX_ROWS):
        part = rows[start : start + MAX_ROWS]
        maps, titles = [], []
        for cond in ("before", "after"):
            for key, title in (("norm_map", "feature norm"), ("attention_map", "LM→image attn")):
                maps.append(
                    np.array([getattr(getattr(r, cond), key) for r in part], dtype=np.float64)
                )
                titles.append(f"{title}, {cond}")
        shown = images[start : start + len(part)] if images is not None else None
        fig = overlay_grid(maps, titles, shown, "feature norm / attention")
        last = start + len(part) - 1
        figs.append(
            Figure(
                f"vlm_maps_{start // MAX_ROWS}",
                f"Images {start}–{last} (one per row): the tower's patch-token norm at "
                f"`{results.feature_site}` and the language model's attention over the image "
                f"tokens ({_query(results)}; mean over heads, rows and layers), without and with "
                "the fix.",
                png_bytes(fig),
                fig,
            )
        )
    return figs


def layer_figure(layer_maps: dict[str, np.ndarray], image: np.ndarray | None) -> Figure:
    """One image's attention map per language-model layer: before (top row), after (bottom)."""
    n_layers = layer_maps["before"].shape[0]
    maps = [np.stack([layer_maps["before"][i], layer_maps["after"][i]]) for i in range(n_layers)]
    shown = np.stack([image, image]) if image is not None else None
    fig = overlay_grid(maps, [f"LM layer {i}" for i in range(n_layers)], shown, "attention")
    return Figure(
        "vlm_layers",
        "Image 0: the language model's attention over the image tokens per layer (mean over "
        "heads and rows), without the fix (top row) and with it (bottom row).",
        png_bytes(fig),
        fig,
    )


def _fix(fix: NamedFix) -> str:
    """``TestTimeRegisters (6 neurons in blocks 6, 7; 1 register; ...)``."""
    if not isinstance(fix, TtrDescription):
        return text(fix.name)
    blocks = ", ".join(map(text, fix.layers)) or "–"
    return (
        f"{text(fix.name)} ({fix.n_neurons} neurons in blocks {blocks}; "
        f"{fix.n_registers} register(s); [CLS] {text(fix.cls)}, patches "
        f"{text(fix.patches)}, {text(fix.mode)} mode)"
    )


def _answer(answer: Any) -> str:
    return f"“{answer}”" if answer else "(empty)"


def _first_token(side: Condition) -> str:
    """The most likely first answer token and its probability."""
    return f"{code(side.first_token.token)} ({num(side.first_token.prob)})"


def image_section(i: int, row: VlmImage) -> Section:
    """One image's answers and numbers, before and after."""
    b, a = row.before, row.after
    ch, ft, out = row.answer_change, row.first_token, row.attention_on_outliers
    table = Table(
        ["", "before", "after"],
        [
            ["answer", _answer(b.answer), _answer(a.answer)],
            ["generated tokens", text(b.n_generated), text(a.n_generated)],
            ["most likely first token (p)", _first_token(b), _first_token(a)],
            [
                "attention mass on image tokens",
                num(b.image_attention_mass_mean),
                num(a.image_attention_mass_mean),
            ],
            ["attention on outlier patches", pct(out.before), pct(out.after)],
            ["max/median patch norm", num(b.max_over_median), num(a.max_over_median)],
            ["max patch norm", num(b.max_patch_norm), num(a.max_patch_norm)],
            ["register norm", "–", num(a.register_norm)],
        ],
    )
    change = (
        f"Answer {'identical' if ch.identical else 'changed'}: "
        f"token edit distance {num(ch.edit_distance)} "
        f"({pct(ch.edit_distance_normalized)} of the longer answer). First answer token: "
        f"KL(before ‖ after) = {num(ft.kl)} nats, largest logit change "
        f"{num(ft.max_abs_logit_change)}, most likely token "
        f"{'unchanged' if ft.same_top_token else 'changed'}. Outlier patches: "
        f"{num(out.n_outlier_patches)} ({text(out.rule)})."
    )
    return Section(f"image-{i}", f"Image {i}", [table, change])


def report(doc: Envelope, figures: list[Figure]) -> Report:
    """The vlm run's report from its typed document: the prompt and the fix, the means over
    images, the maps, one section per image, the images, the model."""
    results: VlmResults = doc.results
    s = results.summary
    intro = Section("summary", "Summary")
    generation = results.generation
    intro.blocks.append(
        f"Prompt: “{results.prompt}” (the language model reads `{results.prompt_text!r}`). "
        f"Greedy answers for {s.n_images} images without and with "
        f"{_fix(results.fix)} on the vision tower; attention rows: {_query(results)}."
        + (f" Generation: {generation.why}." if generation is not None else "")
    )
    values = s.model_dump()
    intro.blocks.append(
        Table(
            ["", "mean over images"],
            [
                [label, pct(values[key]) if unit == "fraction" else num(values[key])]
                for key, label, _, unit in SUMMARY
            ],
        )
    )
    if results.neurons is not None:
        intro.blocks.append(
            f"Register neurons: {results.neurons.n_neurons}, {results.neurons.source}."
        )
    intro.blocks.append(MEANING.format(site=results.feature_site, query=_query(results)))
    maps = [f for f in figures if f.name != "vlm_taxonomy"]
    sections = [intro, figure_section("Maps", maps)]
    if results.taxonomy is not None:
        split = taxonomy_section(results.taxonomy)
        split.blocks += [
            FigureRef(f"figures/{f.filename}", f.caption)
            for f in figures
            if f.name == "vlm_taxonomy"
        ]
        sections.append(split)
    sections += [image_section(i, row) for i, row in enumerate(results.images)]
    sections += [data_section(doc), model_section(doc), provenance_section(doc)]
    return Report(synthetic_banner(doc), "vitreg vlm: language→image attention", sections)


def write_vlm_run(
    out_dir: str | Path,
    results: VlmResults,
    described: ModelInfo,
    data: DataInfo,
    config: ConfigFile,
    command: str,
    images: np.ndarray | None = None,
    layer_maps: dict[str, np.ndarray] | None = None,
) -> Envelope:
    """config.yaml and metrics.json, then figures, report.md and report.html of one vlm run;
    ``images`` ``[n, H, W, 3]`` in [0, 1] under the maps, ``layer_maps`` (``before``/``after``
    ``[L, h, w]`` of image 0) for the per-layer figure; the typed document written."""
    doc = build_document(
        "vlm",
        results.model_dump(mode="json"),
        headlines,
        command=command,
        described=described,
        data=data,
        config=config.to_file(),
        typed=results,
    )

    def draw() -> list[Figure]:
        figures = map_figures(doc.results, images)
        if layer_maps is not None:
            figures.append(layer_figure(layer_maps, images[0] if images is not None else None))
        if doc.results.taxonomy is not None:
            figures.append(taxonomy_figure(doc.results.taxonomy))
        return figures

    write_run(out_dir, doc, report, draw)
    return doc
