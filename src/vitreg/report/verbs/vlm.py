"""Run directory of ``vitreg vlm``: per image, the tower's feature-norm map and the language
model's attention over the image tokens, before and after the fix, side by side; the answers
before and after and how much they changed; traceable headlines in metrics.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitreg.report.document import Headline, build_document
from vitreg.report.fields import as_dict, as_list
from vitreg.report.figures import CLIP_TEXT, MAX_ROWS, Figure, _overlay_grid, png_bytes
from vitreg.report.markdown import (
    Report,
    Section,
    Table,
    code,
    data_section,
    figure_section,
    model_section,
    num,
    pct,
    provenance_section,
    synthetic_banner,
    text,
)
from vitreg.report.writer import write_run

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


def headlines(results: dict[str, Any]) -> list[Headline]:
    """One headline per summary number."""
    return [
        Headline(f"vlm.{key}", f"/results/summary/{key}", better, label, unit=unit)
        for key, label, better, unit in SUMMARY
    ]


def _query(results: dict[str, Any]) -> str:
    q = results["query"]
    return QUERY_TEXT.get(q, str(q)) if isinstance(q, str) else f"positions {q}"


def map_figures(results: dict[str, Any], images: np.ndarray | None) -> list[Figure]:
    """Up to MAX_ROWS images per figure: norm and attention maps, before and after, side by side."""
    rows = results["images"]
    figs = []
    for start in range(0, len(rows), MAX_ROWS):
        part = rows[start : start + MAX_ROWS]
        maps, titles = [], []
        for cond in ("before", "after"):
            for key, title in (("norm_map", "feature norm"), ("attention_map", "LM→image attn")):
                maps.append(np.array([r[cond][key] for r in part], dtype=np.float64))
                titles.append(f"{title}, {cond}")
        shown = images[start : start + len(part)] if images is not None else None
        fig = _overlay_grid(maps, titles, shown, "feature norm / attention")
        last = start + len(part) - 1
        figs.append(
            Figure(
                f"vlm_maps_{start // MAX_ROWS}",
                f"Images {start}–{last} (one per row): the tower's patch-token norm at "
                f"`{results['feature_site']}` and the language model's attention over the image "
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
    fig = _overlay_grid(maps, [f"LM layer {i}" for i in range(n_layers)], shown, "attention")
    return Figure(
        "vlm_layers",
        "Image 0: the language model's attention over the image tokens per layer (mean over "
        "heads and rows), without the fix (top row) and with it (bottom row).",
        png_bytes(fig),
        fig,
    )


def _fix(fix: dict[str, Any]) -> str:
    """``TestTimeRegisters (6 neurons in blocks 6, 7; 1 register; ...)``."""
    if "n_neurons" not in fix:
        return text(fix.get("name") or "the fix")
    blocks = ", ".join(map(text, as_list(fix.get("layers")))) or "–"
    return (
        f"{text(fix.get('name'))} ({text(fix.get('n_neurons'))} neurons in blocks {blocks}; "
        f"{text(fix.get('n_registers'))} register(s); [CLS] {text(fix.get('cls'))}, patches "
        f"{text(fix.get('patches'))}, {text(fix.get('mode'))} mode)"
    )


def _answer(answer: Any) -> str:
    return f"“{answer}”" if answer else "(empty)"


def _first_token(side: dict[str, Any]) -> str:
    """The most likely first answer token and its probability."""
    token = as_dict(side.get("first_token"))
    return f"{code(token.get('token'))} ({num(token.get('prob'))})"


def image_section(i: int, row: dict[str, Any]) -> Section:
    """One image's answers and numbers, before and after."""
    b, a = as_dict(row.get("before")), as_dict(row.get("after"))
    ch, ft = as_dict(row.get("answer_change")), as_dict(row.get("first_token"))
    out = as_dict(row.get("attention_on_outliers"))
    table = Table(
        ["", "before", "after"],
        [
            ["answer", _answer(b.get("answer")), _answer(a.get("answer"))],
            ["generated tokens", text(b.get("n_generated")), text(a.get("n_generated"))],
            ["most likely first token (p)", _first_token(b), _first_token(a)],
            [
                "attention mass on image tokens",
                num(b.get("image_attention_mass_mean")),
                num(a.get("image_attention_mass_mean")),
            ],
            ["attention on outlier patches", pct(out.get("before")), pct(out.get("after"))],
            ["max/median patch norm", num(b.get("max_over_median")), num(a.get("max_over_median"))],
            ["max patch norm", num(b.get("max_patch_norm")), num(a.get("max_patch_norm"))],
            ["register norm", "–", num(a.get("register_norm"))],
        ],
    )
    identical, same = ch.get("identical"), ft.get("same_top_token")
    change = (
        f"Answer {'identical' if identical else 'changed' if identical is not None else '–'}: "
        f"token edit distance {num(ch.get('edit_distance'))} "
        f"({pct(ch.get('edit_distance_normalized'))} of the longer answer). First answer token: "
        f"KL(before ‖ after) = {num(ft.get('kl'))} nats, largest logit change "
        f"{num(ft.get('max_abs_logit_change'))}, most likely token "
        f"{'unchanged' if same else 'changed' if same is not None else '–'}. Outlier patches: "
        f"{num(out.get('n_outlier_patches'))} ({text(out.get('rule'))})."
    )
    return Section(f"image-{i}", f"Image {i}", [table, change])


def report(doc: dict[str, Any], figures: list[Figure]) -> Report:
    results = doc["results"]
    s = results["summary"]
    intro = Section("summary", "Summary")
    intro.blocks.append(
        f"Prompt: “{results['prompt']}” (the language model reads `{results['prompt_text']!r}`). "
        f"Greedy answers for {num(s.get('n_images'))} images without and with "
        f"{_fix(results['fix'])} on the vision tower; attention rows: {_query(results)}."
        + (f" Generation: {results['generation']['why']}." if results.get("generation") else "")
    )
    intro.blocks.append(
        Table(
            ["", "mean over images"],
            [
                [label, pct(s.get(key)) if unit == "fraction" else num(s.get(key))]
                for key, label, _, unit in SUMMARY
            ],
        )
    )
    neurons = as_dict(results.get("neurons"))
    if neurons:
        intro.blocks.append(
            f"Register neurons: {text(neurons.get('n_neurons'))}, {text(neurons.get('source'))}."
        )
    intro.blocks.append(MEANING.format(site=results["feature_site"], query=_query(results)))
    sections = [intro, figure_section("Maps", figures)]
    sections += [image_section(i, as_dict(row)) for i, row in enumerate(results["images"])]
    sections += [data_section(doc), model_section(doc), provenance_section(doc)]
    return Report(synthetic_banner(doc), "vitreg vlm: language→image attention", sections)


def write_vlm_run(
    out_dir: str | Path,
    results: dict[str, Any],
    described: dict[str, Any],
    data: dict[str, Any],
    config: dict[str, Any],
    command: str,
    images: np.ndarray | None = None,
    layer_maps: dict[str, np.ndarray] | None = None,
) -> Path:
    """config.yaml and metrics.json, then figures, report.md and report.html of one vlm run;
    ``images`` ``[n, H, W, 3]`` in [0, 1] under the maps, ``layer_maps`` (``before``/``after``
    ``[L, h, w]`` of image 0) for the per-layer figure."""
    doc = build_document(
        "vlm",
        results,
        headlines(results),
        command=command,
        described=described,
        data=data,
        config=config,
    )

    def draw() -> list[Figure]:
        figures = map_figures(doc["results"], images)
        if layer_maps is not None:
            figures.append(layer_figure(layer_maps, images[0] if images is not None else None))
        return figures

    return write_run(out_dir, doc, report, draw)
