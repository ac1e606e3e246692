"""report.md, and the section structure report.html shares, built from a metrics.json document.

Every number shown is read from the document's ``results`` block (the analyses' own
``to_dict``), so the report and metrics.json never disagree. A section whose analysis is
missing or does not apply says so in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vitreg.core.weights import WEIGHT_KINDS
from vitreg.report.fields import as_dict, as_list, dig, finite
from vitreg.report.schema import is_synthetic

FIGURE_SECTION = {
    "norm_maps": "norms",
    "norm_quantiles": "norms",
    "norm_histograms": "norms",
    "attention_maps": "attention",
    "attention_heads": "attention",
    "attention_agreement": "attention",
    "redundancy_maps": "redundancy",
    "ln_similarity": "ln_separation",
    "channel_ownership": "ln_separation",
    "feature_pictures": "features",
    "sink_map": "sinks",
    "position_maps": "positions",
}
RULE_ORDER = ("absolute", "top_p", "robust_z", "auto")


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class FigureRef:
    filename: str
    caption: str


Block = str | Table | FigureRef  # a str is a paragraph (**bold** and `code` allowed)


@dataclass
class Section:
    key: str
    title: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Report:
    banner: str | None
    title: str
    sections: list[Section]


def num(x: Any, digits: int = 3) -> str:
    """A number as text (``–`` for missing)."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}g}"


def text(x: Any) -> str:
    """A value as text: ``–`` for missing, JSON for lists and dicts (never a Python repr)."""
    if x is None:
        return "–"
    if isinstance(x, (dict, list, tuple)):
        return json.dumps(x, default=str)
    return num(x) if isinstance(x, (bool, int, float)) else str(x)


def code(x: Any) -> str:
    """A value as inline code (``–`` for missing), fenced by :func:`code_span` so a backtick,
    ``|`` or ``<tag>`` in it (a path, a command line) stays literal."""
    return "–" if x is None or x == "" else code_span(text(x))


def pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def _unavailable(doc: dict[str, Any], name: str, label: str) -> str:
    reason = dig(doc, "results", "not_applicable", name)
    return f"Not available: {reason or f'the {label} analysis was not run'}."


def is_random_init(doc: dict[str, Any]) -> bool:
    """Whether the run's model has random, untrained weights: its recorded weight kind, or
    ``--random-init`` in the config of runs written before the kind was recorded."""
    model, config = doc.get("model"), doc.get("config")
    if isinstance(model, dict) and model.get("weights") == "random":
        return True
    return isinstance(config, dict) and bool(config.get("random_init"))


def random_init_banner(name: str) -> str:
    """The banner of a report on a model with random weights (``--random-init``,
    ``pretrained=False``)."""
    return (
        f"**RANDOM WEIGHTS:** `{name}` has random, untrained weights (`--random-init` or "
        "`pretrained=False`); no trained weights were loaded. Artifacts found here, or their absence, say nothing about the trained model; "
        "use this report to check the tool, not to draw conclusions about the model."
    )


def build_report(doc: dict[str, Any], figures: Iterable[Any] = ()) -> Report:
    """The report's sections from a metrics.json document and the figures (name, caption)."""
    model = doc["model"]
    name = model.get("spec") or model.get("class_name") or "model"
    banner = None
    if is_synthetic(model):
        banner = (
            f"**SYNTHETIC MODEL:** `{name}` has random weights with planted artifacts; it is not "
            "a trained ViT. Use this report to check the tool, not to draw conclusions about "
            "real models."
        )
    elif is_random_init(doc):
        banner = random_init_banner(name)
    from vitreg.report.kinds_sections import detail_sections, kinds_section

    kinds = dig(doc, "results", "kinds") is not None  # documents written before issue 20: none
    sections = [
        *([kinds_section(doc)] if kinds else []),
        _verdict(doc),
        model_section(doc),
        data_section(doc),
        _norms(doc),
        _final_norm(doc),
        _attention(doc),
        _redundancy(doc),
        _ln(doc),
        _features(doc),
        *(detail_sections(doc) if kinds else []),
        _not_applicable(doc),
        provenance_section(doc),
    ]
    by_key = {s.key: s for s in sections}
    for fig in figures:
        key = FIGURE_SECTION.get(fig.name, "norms")
        by_key[key].blocks.append(FigureRef(f"figures/{fig.filename}", fig.caption))
    return Report(banner, f"vitreg diagnose: {name}", sections)


def _norms_block(doc: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The norms block and its per-layer entries (each a dict; none when the block is empty)."""
    norms = as_dict(dig(doc, "results", "norms"))
    return norms, [as_dict(lo) for lo in as_list(norms.get("layers"))]


def _verdict(doc: dict[str, Any]) -> Section:
    norms, layers = _norms_block(doc)
    ev = as_dict(norms.get("evidence"))
    s = Section("verdict", "Verdict")
    if norms.get("artifacts_present"):
        with_mode = as_list(ev.get("layers_with_outlier_mode"))
        s.blocks.append(
            f"**Artifacts found.** From layer {text(norms.get('emergence_layer'))} on (layers 0 "
            f"to {len(layers) - 1}), patch-token norms on the residual stream split into a "
            f"separate high-norm outlier mode. At layer {text(ev.get('strongest_layer'))} (the "
            f"clearest split) the outlier mode holds {pct(ev.get('outlier_rate'))} of patch "
            f"tokens and its median norm is {num(ev.get('mode_ratio'))}× the bulk's (Ashman D = "
            f"{num(ev.get('ashman_d'))}). Layers with an outlier mode: "
            f"{', '.join(map(str, with_mode)) or 'none'}."
        )
    else:
        ratios = [lo for lo in layers if finite(lo.get("max_over_median"))]
        peak = max(ratios, key=lambda lo: lo["max_over_median"]) if ratios else None
        said = (
            "**No artifacts found.** No layer's patch-token norms split into a separate "
            "high-norm mode, so no token is flagged as a high-norm outlier."
        )
        if peak:
            said += (
                f" The largest max/median norm ratio is {num(peak['max_over_median'])} "
                f"(layer {text(peak.get('layer'))})."
            )
        if "top_p" in as_dict(norms.get("rules")):
            p = dig(norms, "rules", "top_p", "p")
            said += (
                f" The top_p rule still flags {num(2.0 if p is None else p)}% of tokens at every "
                "layer: it does so in every model, by construction."
            )
        s.blocks.append(said)
    s.blocks.append(f"Presence test: {text(ev.get('criteria'))}.")
    return s


def model_section(doc: dict[str, Any]) -> Section:
    m = doc["model"]
    lay = m.get("layout", {})
    rows = [
        ["spec", code_span(m["spec"]) if m.get("spec") else "– (wrapped module)"],
        ["family / source", f"{text(m.get('family'))} / {text(m.get('source') or None)}"],
        ["weights", text(WEIGHT_KINDS.get(m.get("weights"), "not recorded"))],
        ["class", code(m.get("class_name"))],
        [
            "token layout",
            f"{lay.get('n_cls', 0)} [CLS], {lay.get('n_reg', 0)} registers, "
            f"{lay.get('n_patches', '?')} patches on a {lay.get('grid')} grid, "
            f"patch size {lay.get('patch_size')}",
        ],
        ["dimensions", ", ".join(f"{k} {num(v)}" for k, v in m.get("dims", {}).items())],
        ["image size", text(m.get("image_size"))],
        ["attention path", text(m.get("attention"))],
    ]
    s = Section("model", "Model", [Table(["", ""], rows)])
    s.blocks += [f"Note: {n}" for n in m.get("notes", [])]
    return s


def data_section(doc: dict[str, Any]) -> Section:
    d = doc["data"]
    s = Section("data", "Images")
    desc = f" (source: {d['description']})" if d.get("description") else ""
    s.blocks.append(f"{d['n_images']} images{desc} were analysed.")
    if d.get("synthetic"):
        s.blocks.append(
            "The images are synthetic (generated textures with flat regions), not photos."
        )
    if d["skipped"]:
        s.blocks.append(f"{len(d['skipped'])} files were skipped:")
        rows = [[code_span(k), escape_text(v)] for k, v in d["skipped"].items()]
        s.blocks.append(Table(["file", "reason"], rows))
    else:
        s.blocks.append("No file was skipped.")
    if d["converted"]:
        s.blocks.append(f"{len(d['converted'])} files were converted to 8-bit RGB:")
        s.blocks.append(
            Table(
                ["file", "original mode"],
                [[code_span(k), escape_text(v)] for k, v in d["converted"].items()],
            )
        )
    return s


def _norms(doc: dict[str, Any]) -> Section:
    norms, layers = _norms_block(doc)
    given = as_dict(norms.get("rules"))
    rules = [r for r in RULE_ORDER if r in given] + [r for r in given if r not in RULE_ORDER]
    s = Section("norms", "Token norms and outliers")
    span = f"{code(layers[0].get('site'))} … {code(layers[-1].get('site'))}" if layers else "–"
    s.blocks.append(
        f"Norms are L2 norms of patch tokens on the residual stream (each block's output, {span}, "
        "before any final norm), computed in float32. The rules side by side (share of patch "
        "tokens flagged): " + "; ".join(f"`{r}` {_params(given[r])}" for r in rules) + "."
    )
    staged = any(lo.get("site") != f"blocks.{lo.get('layer')}.hook_resid_post" for lo in layers)
    header = ["layer", *(["site"] if staged else []), "median norm", "p98/median", "max/median"]
    header += [*rules, "outlier mode"]
    rows = [_norm_row(text(lo.get("layer")), lo, rules, staged) for lo in layers]
    final = norms.get("after_final_norm")
    if isinstance(final, dict) and final:
        rows.append(_norm_row("after final norm", final, rules, staged))
    s.blocks.append(Table(header, rows))
    if "top_p" in rules:
        s.blocks.append(
            "`top_p` flags the top p% of tokens in every model, with or without artifacts: it "
            "says which tokens are largest, never whether there are artifacts."
        )
    if not norms.get("artifacts_present"):
        s.blocks.append(
            "`auto` flags nothing here (no outlier mode, threshold infinite); compare models "
            "with `top_p` if you need a fixed share of tokens."
        )
    e = norms.get("emergence_layer")
    s.blocks.append(
        f"**Emergence layer:** {text(e)} (the first layer from which an outlier mode holds at "
        "that layer and the next)."
        if e is not None
        else "**Emergence layer:** none (no layer has an outlier mode)."
    )
    return s


def _params(params: Any) -> str:
    params = as_dict(params)
    return "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "(fitted)"


def _norm_row(label: str, lo: dict[str, Any], rules: list[str], staged: bool) -> list[str]:
    rates = [pct(dig(lo, "outlier_rate", r)) for r in rules]
    mode = "yes" if lo.get("artifacts_present") else "no"
    site = [code(lo.get("site"))] if staged else []
    return [
        label,
        *site,
        num(dig(lo, "quantiles", "p50")),
        num(lo.get("p98_over_median")),
        num(lo.get("max_over_median")),
        *rates,
        mode,
    ]


def _final_norm(doc: dict[str, Any]) -> Section:
    norms, layers = _norms_block(doc)
    final = norms.get("after_final_norm")
    s = Section("final_norm", "Before vs after the final norm")
    if not isinstance(final, dict) or not final:
        s.blocks.append(
            "Not available: the model exposes no final-norm output (`ln_final.hook_out`)."
        )
        return s
    last = layers[-1] if layers else {}
    compare = (
        f"max/median patch norm {num(last.get('max_over_median'))} at the last layer (residual "
        f"stream) vs {num(final.get('max_over_median'))} after the final norm"
    )
    if norms.get("artifacts_present") and not final.get("artifacts_present"):
        s.blocks.append(
            f"**Warning:** the outliers are not visible after the final norm ({compare}). Measure "
            "norms on the residual stream, before the final LayerNorm: measuring after it is a "
            "common reason for failing to reproduce the artifacts (dinov2 issue 373)."
        )
    elif norms.get("artifacts_present"):
        s.blocks.append(f"The outliers stay visible after the final norm ({compare}).")
    else:
        s.blocks.append(f"No outlier mode on the residual stream; {compare}.")
    return s


def _attention(doc: dict[str, Any]) -> Section:
    s = Section("attention", "Attention artifacts")
    attn = dig(doc, "results", "attention")
    if not isinstance(attn, dict) or not attn:
        s.blocks.append(_unavailable(doc, "attention", "attention"))
        return s
    defs = as_dict(attn.get("definitions"))
    s.blocks.append(
        f"Maps: {text(defs.get('map', attn.get('query')))}; attention pattern: "
        f"{attn.get('attention_source') or '–'}. Attention artifacts: "
        f"{text(defs.get('artifact'))}."
    )
    method = attn.get("norm_method")
    if method:
        why = (
            "the artifact verdict is positive"
            if method == "auto"
            else "no outlier mode, so the top p% norms stand in: high-norm tokens, not artifacts"
        )
        s.blocks.append(
            f"Agreement compares them with the norm outliers of the same block's output by the "
            f"`{method}` rule ({why}): {defs.get('agreement') or ''}."
        )
    norms, layers = _norms_block(doc)
    shown = dig(norms, "evidence", "strongest_layer")
    site = dig(layers, shown if isinstance(shown, int) else -1, "site")
    agreement = [as_dict(a) for a in as_list(attn.get("agreement"))]
    at = next((a for a in agreement if site is not None and a.get("norm_site") == site), None)
    if at and at.get("iou") is not None:
        s.blocks.append(
            f"At {code(site)}, attention artifacts and norm outliers agree with IoU "
            f"{num(at['iou'])} (precision {num(at.get('precision'))}, recall "
            f"{num(at.get('recall'))}); a low IoU means the attention-map artifacts and the "
            "high-norm tokens are different patches."
        )
    elif at:
        s.blocks.append(
            f"No agreement at {code(site)}: {at.get('reason') or 'no artifacts on either side'}."
        )
    ks = sorted(k for k in attn if k.startswith("sink_mass_top"))
    # the keys are every token, the query's own included: [CLS]->[CLS] counts (said below)
    header = ["layer", *(f"top-{k.removeprefix('sink_mass_top')} mass (self incl.)" for k in ks)]
    header += [
        "entropy (norm.)",
        "max map",
        "artifact rate",
        "precision",
        "recall",
        "IoU",
        "top-p IoU",
    ]
    rows = []
    for i, layer in enumerate(as_list(attn.get("layers"))):
        a = as_dict(dig(agreement, i))
        rows.append(
            [
                text(layer),
                *(num(dig(attn, k, i)) for k in ks),
                num(dig(attn, "entropy_normalized", i)),
                num(dig(attn, "cls_to_patch_max", i)),
                pct(dig(attn, "artifact_rate", i)),
                *(num(a.get(k)) for k in ("precision", "recall", "iou", "top_p_iou")),
            ]
        )
    s.blocks.append(Table(header, rows))
    if ks:
        s.blocks.append(
            f"Top-k mass: {defs.get('sink_mass', 'mass of the top-k keys of each row')}. A "
            "query's own key is among them, so [CLS] attending to itself counts in the [CLS] "
            "row's top-1 mass (self incl.)."
        )
    s.blocks += [f"Note: {n}" for n in as_list(attn.get("notes"))]
    return s


def _redundancy(doc: dict[str, Any]) -> Section:
    s = Section("redundancy", "Where outliers sit: local redundancy")
    red = dig(doc, "results", "redundancy")
    if not isinstance(red, dict) or not red:
        s.blocks.append(_unavailable(doc, "redundancy", "redundancy"))
        return s
    s.blocks.append(
        f"Local redundancy: {red.get('measure') or 'neighbour cosine similarity'}, at the patch "
        f"embedding ({code(red.get('embed_site'))}) and at {code(red.get('layer_site'))}. "
        f"Outliers there: {num(red.get('n_outliers'))} patches ({pct(red.get('outlier_rate'))}) "
        f"by the {code(red.get('outlier_method'))} rule ({text(red.get('outlier_method_reason'))})."
    )
    if red.get("note"):
        s.blocks.append(f"Note: {red['note']}")
    vs = as_dict(red.get("outlier_vs_normal"))
    if vs:
        s.blocks.append(
            "AUC = probability that an outlier's redundancy exceeds a normal patch's (0.5: no "
            "difference; above: outliers sit in more redundant regions). A median is – where "
            "there is no patch of its kind (no outlier patches, or only outliers)."
        )
        rows = [
            [
                code(m),
                num(dig(v, "outlier", "median")),
                num(dig(v, "normal", "median")),
                num(dig(v, "auc")),
            ]
            for m, v in vs.items()
        ]
        s.blocks.append(Table(["measure", "outlier median", "normal median", "AUC"], rows))
    curve = as_dict(red.get("rate_by_redundancy"))
    bins = [as_dict(b) for b in as_list(curve.get("bins"))]
    if bins:
        s.blocks.append(
            f"Outlier rate by {code(curve.get('measure'))} redundancy "
            f"({text(curve.get('binning'))}):"
        )
        rows = [
            [
                f"{num(b.get('lo'))} – {num(b.get('hi'))}",
                num(b.get("n")),
                pct(b.get("outlier_rate")),
            ]
            for b in bins
        ]
        s.blocks.append(Table(["redundancy bin", "patches", "outlier rate"], rows))
    border, bg = as_dict(red.get("border")), as_dict(red.get("background"))
    if border:
        s.blocks.append(
            f"Border ({text(border.get('definition'))}): outlier rate "
            f"{pct(border.get('outlier_rate_border'))} vs "
            f"{pct(border.get('outlier_rate_interior'))} inside."
        )
    if bg:
        s.blocks.append(
            f"Background ({text(bg.get('definition'))}): outlier rate "
            f"{pct(bg.get('outlier_rate_background'))} vs {pct(bg.get('outlier_rate_foreground'))} "
            f"elsewhere; {pct(bg.get('outlier_share_in_background'))} of outliers are background."
        )
    return s


def _ln(doc: dict[str, Any]) -> Section:
    s = Section("ln_separation", "[CLS]/patch separation by LayerNorm")
    ln = dig(doc, "results", "ln_separation")
    if not isinstance(ln, dict) or not ln:
        s.blocks.append(_unavailable(doc, "ln_separation", "LayerNorm separation"))
        return s
    pairs = ["cls_patch", "patch_patch"] + (["register_patch"] if ln.get("has_registers") else [])
    header = ["block"]
    for p in pairs:
        header += [f"{p} before norm1", f"{p} after norm1"]
    header += ["owned channels", "norm1 gain owned/other"]
    similarity = as_list(ln.get("similarity"))
    rows = []
    for b, sim in enumerate(similarity):
        row = [str(b)]
        for p in pairs:
            row += [num(dig(sim, pt, p, "mean")) for pt in ("pre_ln1", "post_ln1")]
        row += [
            pct(dig(ln, "owned_channel_fraction", b)),
            num(dig(ln, "ln1_gain_owned_over_other", b)),
        ]
        rows.append(row)
    if ln.get("has_cls"):
        pre, post = (
            _mean(dig(sim, pt, "cls_patch", "mean") for sim in similarity)
            for pt in ("pre_ln1", "post_ln1")
        )
        s.blocks.append(
            f"Mean [CLS]–patch cosine similarity over blocks: {num(pre)} before norm1, "
            f"{num(post)} after. A drop to about zero after norm1 means the norm separates [CLS] "
            "from patches (Marouani et al., ICLR 2026)."
        )
    s.blocks.append(
        f"Mean cosine similarity averaged over images; owned channels: "
        f"{text(ln.get('owned_threshold'))}, measured at each block's input."
    )
    s.blocks.append(Table(header, rows))
    return s


def _features(doc: dict[str, Any]) -> Section:
    s = Section("features", "The features: PCA colours and patch similarity")
    pics = dig(doc, "results", "feature_pictures")
    if not isinstance(pics, dict) or not pics:
        s.blocks.append(_unavailable(doc, "feature_pictures", "feature picture"))
        return s
    for p in map(as_dict, as_list(pics.get("sites"))):
        share = ", ".join(pct(v) for v in as_list(dig(p, "pca", "explained_variance"))) or "–"
        query = as_list(p.get("query_patch"))
        row, col = (text(dig(query, i)) for i in (0, 1))
        s.blocks.append(
            f"At {code(p.get('site'))} ({text(p.get('where'))}): the first three principal "
            f"components of all {num(dig(p, 'pca', 'n_patches'))} patch tokens explain {share} "
            f"of the variance; the similarity map is the cosine similarity of patch (row {row}, "
            f"column {col}), the centre, to every patch of its image."
        )
    skipped = as_dict(pics.get("skipped"))
    s.blocks += [f"No picture at {code(site)}: {text(why)}." for site, why in skipped.items()]
    return s


def _mean(values: Iterable[Any]) -> float | None:
    v = [float(x) for x in values if finite(x)]
    return sum(v) / len(v) if v else None


def _not_applicable(doc: dict[str, Any]) -> Section:
    s = Section("not_applicable", "What did not apply")
    na = as_dict(dig(doc, "results", "not_applicable"))
    s.blocks += [f"`{k}`: {v}" for k, v in na.items()] or ["Every analysis that ran applied."]
    return s


def provenance_section(doc: dict[str, Any]) -> Section:
    keys = ("vitreg_version", "torch_version", "timm_version", "transformers_version")
    rows = [
        [k, text(doc.get(k)) if doc.get(k) is not None else "not installed"]
        for k in (*keys, "open_clip_version", "python_version")
    ]
    rows += [["created (UTC)", doc["created"]], ["command", code(doc["command"])]]
    rows += [[f"config: {k}", code(v)] for k, v in doc["config"].items()]
    return Section("provenance", "Provenance", [Table(["", ""], rows)])


def render_markdown(report: Report) -> str:
    """The report as Markdown; its first line is the synthetic-model banner when there is one."""
    lines: list[str] = []
    if report.banner:
        lines += [report.banner, ""]
    lines += [f"# {report.title}", ""]
    for s in report.sections:
        lines += [f"## {s.title}", ""]
        for b in s.blocks:
            lines += [*_md_block(b), ""]
    return "\n".join(lines).rstrip() + "\n"


def markdown_table(table: Table) -> str:
    """A table as GitHub-flavoured Markdown, one line per row; every report table is rendered here."""
    row = lambda cells: "| " + " | ".join(map(_cell, cells)) + " |"  # noqa: E731
    lines = [row(table.header), "|" + "---|" * len(table.header), *map(row, table.rows)]
    return "\n".join(lines) + "\n"


def _cell(x: Any) -> str:
    """A cell's text: ``|`` escaped, line breaks as spaces (a table row is one line)."""
    text = str(x).replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("|", "\\|").replace("\n", " ")


def code_span(x: Any) -> str:
    """``x`` (a file name, a path, a spec) as one inline code span whatever it holds: fenced by
    more backticks than its longest backtick run (CommonMark), padded when it starts or ends with
    one, line breaks as spaces; ``<tags>`` and ``*`` inside a code span are shown, not rendered,
    and in a table cell ``|`` is escaped by the table writer. The one writer of names in reports."""
    import re

    text = " ".join(str(x).splitlines()) or " "
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" or text.strip(" ") == "" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def escape_text(x: Any) -> str:
    """Free text that may hold file names (a skip reason quoting a path) with every Markdown and
    HTML marker backslash-escaped, so it shows as written (``|`` is left to the table writer)."""
    import re

    return re.sub(r"([\\`*_\[\]<>~&#!])", r"\\\1", " ".join(str(x).splitlines()))


def _md_block(b: Block) -> list[str]:
    if isinstance(b, Table):
        return markdown_table(b).splitlines()
    if isinstance(b, FigureRef):
        stem = b.filename.rsplit("/", 1)[-1].removesuffix(".png")
        return [f"![{stem}]({b.filename})", "", f"*{b.caption}*"]
    return [b]
