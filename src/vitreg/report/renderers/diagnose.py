"""The sections of a ``vitreg diagnose`` report, read from its typed results
(:class:`~vitreg.results.diagnose.DiagnoseResults`): a statistic of nothing is ``None``
in the type and ``–`` on the page, so no results the schema accepts can crash a section."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitreg.analysis.attention import AttentionResult
from vitreg.analysis.diagnose import DiagnoseResult
from vitreg.analysis.feature_pictures import FeaturePicturesResult
from vitreg.analysis.norms import NormsResult
from vitreg.analysis.redundancy import RedundancyResult
from vitreg.report.document import Headline, build_document, headline_values
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
    finite,
    inline_text,
    num,
    pct,
    text,
)
from vitreg.report.render.plots import Figure, display_images
from vitreg.report.renderers.diagnose_figures import (
    attention_agreement,
    attention_heads,
    attention_maps,
    channel_ownership,
    feature_pictures,
    kinds_figures,
    ln_similarity,
    norm_histograms,
    norm_maps,
    norm_quantiles,
    redundancy_maps,
)
from vitreg.report.renderers.diagnose_kinds import detail_sections, kinds_section
from vitreg.report.writer import write_run
from vitreg.results.diagnose import DiagnoseResults, SiteNorms
from vitreg.results.schema import Envelope, model_info, plain
from vitreg.settings.base import ConfigFile

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
    "sink_concentration": "sinks",
    "position_maps": "positions",
}
RULE_ORDER = ("absolute", "top_p", "robust_z", "auto")


def report(doc: Envelope, figures: Iterable[Any] = ()) -> Report:
    """The report's sections from the typed metrics.json document and the figures (name,
    caption)."""
    name = doc.model.spec or doc.model.class_name or "model"
    r: DiagnoseResults = doc.results
    kinds = r.kinds is not None  # documents written before the kinds analyses: none
    sections = [
        *([kinds_section(r)] if kinds else []),
        _verdict(r),
        model_section(doc),
        data_section(doc),
        _norms(r),
        _final_norm(r),
        _attention(r),
        _redundancy(r),
        _ln(r),
        _features(r),
        *(detail_sections(r) if kinds else []),
        _not_applicable(r),
        provenance_section(doc),
    ]
    by_key = {s.key: s for s in sections}
    for fig in figures:
        key = FIGURE_SECTION.get(fig.name, "norms")
        by_key[key].blocks.append(FigureRef(f"figures/{fig.filename}", fig.caption))
    return Report(
        synthetic_banner(doc, "planted artifacts"),
        f"vitreg diagnose: {inline_text(name)}",
        sections,
    )


def _unavailable(r: DiagnoseResults, name: str, label: str) -> str:
    reason = r.not_applicable.get(name)
    return f"Not available: {reason or f'the {label} analysis was not run'}."


def _verdict(r: DiagnoseResults) -> Section:
    norms, ev = r.norms, r.norms.evidence
    s = Section("verdict", "Verdict")
    if norms.artifacts_present:
        with_mode = ", ".join(map(str, ev.layers_with_outlier_mode)) or "none"
        s.blocks.append(
            f"**Artifacts found.** From block {text(norms.emergence_layer)} on (blocks 0 "
            f"to {len(norms.layers) - 1}), patch-token norms on the residual stream split into a "
            f"separate high-norm outlier mode. At block {text(ev.strongest_layer)} (the "
            f"clearest split) the outlier mode holds {pct(ev.outlier_rate)} of patch "
            f"tokens and its median norm is {num(ev.mode_ratio)}× the bulk's (Ashman D = "
            f"{num(ev.ashman_d)}). Blocks with an outlier mode: {with_mode}."
        )
    else:
        ratios = [lo for lo in norms.layers if finite(lo.max_over_median)]
        peak = max(ratios, key=lambda lo: lo.max_over_median) if ratios else None
        said = (
            "**No artifacts found.** No block's patch-token norms split into a separate "
            "high-norm mode, so no token is flagged as a high-norm outlier."
        )
        if peak:
            said += (
                f" The largest max/median norm ratio is {num(peak.max_over_median)} "
                f"(block {text(peak.layer)})."
            )
        if "top_p" in norms.rules:
            p = norms.rules["top_p"].get("p", 2.0)
            said += (
                f" The top_p rule still flags {num(p)}% of tokens at every "
                "block: it does so in every model, by construction."
            )
        s.blocks.append(said)
    s.blocks.append(f"Presence test: {text(ev.criteria)}.")
    return s


def _rules(r: DiagnoseResults) -> list[str]:
    given = r.norms.rules
    return [k for k in RULE_ORDER if k in given] + [k for k in given if k not in RULE_ORDER]


def _norms(r: DiagnoseResults) -> Section:
    norms, layers = r.norms, r.norms.layers
    rules = _rules(r)
    s = Section("norms", "Token norms and outliers")
    span = f"{code(layers[0].site)} … {code(layers[-1].site)}" if layers else "–"
    s.blocks.append(
        f"Norms are L2 norms of patch tokens on the residual stream (each block's output, {span}, "
        "before any final norm), computed in float32. The rules side by side (share of patch "
        "tokens flagged): " + "; ".join(f"`{k}` {_params(norms.rules[k])}" for k in rules) + "."
    )
    staged = any(lo.site != f"blocks.{lo.layer}.hook_resid_post" for lo in layers)
    header = ["block", *(["site"] if staged else []), "median norm", "p98/median", "max/median"]
    header += [*rules, "outlier mode"]
    rows = [_norm_row(text(lo.layer), lo, rules, staged) for lo in layers]
    if norms.after_final_norm is not None:
        rows.append(_norm_row("after final norm", norms.after_final_norm, rules, staged))
    s.blocks.append(Table(header, rows))
    if "top_p" in rules:
        s.blocks.append(
            "`top_p` flags the top p% of tokens in every model, with or without artifacts: it "
            "says which tokens are largest, never whether there are artifacts."
        )
    if not norms.artifacts_present:
        s.blocks.append(
            "`auto` flags nothing here (no outlier mode, threshold infinite); compare models "
            "with `top_p` if you need a fixed share of tokens."
        )
    e = norms.emergence_layer
    s.blocks.append(
        f"**Emergence block:** {e} (the first block from which an outlier mode holds at "
        "that block and the next)."
        if e is not None
        else "**Emergence block:** none (no block has an outlier mode)."
    )
    return s


def _params(params: dict[str, float]) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "(fitted)"


def _norm_row(label: str, lo: SiteNorms, rules: list[str], staged: bool) -> list[str]:
    rates = [pct(lo.outlier_rate.get(k)) for k in rules]
    site = [code(lo.site)] if staged else []
    return [
        label,
        *site,
        num(lo.quantiles.p50),
        num(lo.p98_over_median),
        num(lo.max_over_median),
        *rates,
        "yes" if lo.artifacts_present else "no",
    ]


def _final_norm(r: DiagnoseResults) -> Section:
    norms, final = r.norms, r.norms.after_final_norm
    s = Section("final_norm", "Before vs after the final norm")
    if final is None:
        s.blocks.append(
            "Not available: the model exposes no final-norm output (`ln_final.hook_out`)."
        )
        return s
    last = num(norms.layers[-1].max_over_median) if norms.layers else "–"
    compare = (
        f"max/median patch norm {last} at the last block (residual "
        f"stream) vs {num(final.max_over_median)} after the final norm"
    )
    if norms.artifacts_present and not final.artifacts_present:
        s.blocks.append(
            f"**Warning:** the outliers are not visible after the final norm ({compare}). Measure "
            "norms on the residual stream, before the final LayerNorm: measuring after it is a "
            "common reason for failing to reproduce the artifacts (dinov2 issue 373)."
        )
    elif norms.artifacts_present:
        s.blocks.append(f"The outliers stay visible after the final norm ({compare}).")
    else:
        s.blocks.append(f"No outlier mode on the residual stream; {compare}.")
    return s


def shown_site(r: DiagnoseResults) -> str | None:
    """The block output the headlines describe: the strongest outlier block, else the last."""
    layers, strongest = r.norms.layers, r.norms.evidence.strongest_layer
    if not layers:
        return None
    at = next((lo for lo in layers if lo.layer == strongest), None)
    return (at or layers[-1]).site


def _attention(r: DiagnoseResults) -> Section:
    s = Section("attention", "Attention artifacts")
    attn = r.attention
    if attn is None:
        s.blocks.append(_unavailable(r, "attention", "attention"))
        return s
    defs = attn.definitions
    s.blocks.append(
        f"Maps: {text(defs.get('map', attn.query))}; attention pattern: "
        f"{text(attn.attention_source)}. Attention artifacts: {text(defs.get('artifact'))}."
    )
    if attn.norm_method:
        why = (
            "the artifact verdict is positive"
            if attn.norm_method == "auto"
            else "no outlier mode, so the top p% norms stand in: high-norm tokens, not artifacts"
        )
        s.blocks.append(
            f"Agreement compares them with the norm outliers of the same block's output by the "
            f"`{attn.norm_method}` rule ({why}): {defs.get('agreement', '')}."
        )
    site = shown_site(r)
    at = next((a for a in attn.agreement if site is not None and a.norm_site == site), None)
    if at is not None and at.iou is not None:
        s.blocks.append(
            f"At {code(site)}, attention artifacts and norm outliers agree with IoU "
            f"{num(at.iou)} (precision {num(at.precision)}, recall {num(at.recall)}); a low IoU "
            "means the attention-map artifacts and the high-norm tokens are different patches."
        )
    elif at is not None:
        s.blocks.append(
            f"No agreement at {code(site)}: {at.reason or 'no artifacts on either side'}."
        )
    ks = sorted(attn.sink_mass, key=lambda k: (len(k), k))
    # the keys are every token, the query's own included: [CLS]->[CLS] counts (said below)
    header = ["block", *(f"top-{k} mass (self incl.)" for k in ks)]
    header += ["entropy (norm.)", "max map", "artifact rate"]
    header += ["precision", "recall", "IoU", "top-p IoU"]
    rows = []
    for i, layer in enumerate(attn.layers):
        a = attn.agreement[i] if i < len(attn.agreement) else None
        scores = (a.precision, a.recall, a.iou, a.top_p_iou) if a else (None,) * 4
        rows.append(
            [
                text(layer),
                *(num(_at(attn.sink_mass[k], i)) for k in ks),
                num(_at(attn.entropy_normalized, i)),
                num(_at(attn.cls_to_patch_max, i)),
                pct(_at(attn.artifact_rate, i)),
                *map(num, scores),
            ]
        )
    s.blocks.append(Table(header, rows))
    if ks:
        s.blocks.append(
            f"Top-k mass: {defs.get('sink_mass', 'mass of the top-k keys of each row')}. A "
            "query's own key is among them, so [CLS] attending to itself counts in the [CLS] "
            "row's top-1 mass (self incl.)."
        )
    s.blocks += [f"Note: {n}" for n in attn.notes]
    return s


def _at(values: list[Any], i: int) -> Any:
    """``values[i]``, or None past its end (a list shorter than the layers)."""
    return values[i] if i < len(values) else None


def _redundancy(r: DiagnoseResults) -> Section:
    s = Section("redundancy", "Where outliers sit: local redundancy")
    red = r.redundancy
    if red is None:
        s.blocks.append(_unavailable(r, "redundancy", "redundancy"))
        return s
    s.blocks.append(
        f"Local redundancy: {red.measure or 'neighbour cosine similarity'}, at the patch "
        f"embedding ({code(red.embed_site)}) and at {code(red.layer_site)}. "
        f"Outliers there: {num(red.n_outliers)} patches ({pct(red.outlier_rate)}) "
        f"by the {code(red.outlier_method)} rule ({text(red.outlier_method_reason)})."
    )
    if red.note:
        s.blocks.append(f"Note: {red.note}")
    if red.outlier_vs_normal:
        s.blocks.append(
            "AUC = probability that an outlier's redundancy exceeds a normal patch's (0.5: no "
            "difference; above: outliers sit in more redundant regions). A median is – where "
            "there is no patch of its kind (no outlier patches, or only outliers)."
        )
        rows = [
            [
                code(m),
                num(v.outlier.median if v.outlier else None),
                num(v.normal.median if v.normal else None),
                num(v.auc),
            ]
            for m, v in red.outlier_vs_normal.items()
        ]
        s.blocks.append(Table(["measure", "outlier median", "normal median", "AUC"], rows))
    curve = red.rate_by_redundancy
    if curve.bins:
        s.blocks.append(
            f"Outlier rate by {code(curve.measure)} redundancy ({text(curve.binning)}):"
        )
        rows = [[f"{num(b.lo)} – {num(b.hi)}", num(b.n), pct(b.outlier_rate)] for b in curve.bins]
        s.blocks.append(Table(["redundancy bin", "patches", "outlier rate"], rows))
    border, bg = red.border, red.background
    s.blocks.append(
        f"Border ({text(border.definition)}): outlier rate {pct(border.outlier_rate_border)} vs "
        f"{pct(border.outlier_rate_interior)} inside."
    )
    s.blocks.append(
        f"Background ({text(bg.definition)}): outlier rate {pct(bg.outlier_rate_background)} vs "
        f"{pct(bg.outlier_rate_foreground)} elsewhere; {pct(bg.outlier_share_in_background)} of "
        "outliers are background."
    )
    return s


def _ln(r: DiagnoseResults) -> Section:
    s = Section("ln_separation", "[CLS]/patch separation by LayerNorm")
    ln = r.ln_separation
    if ln is None:
        s.blocks.append(_unavailable(r, "ln_separation", "LayerNorm separation"))
        return s
    pairs = ["cls_patch", "patch_patch"] + (["register_patch"] if ln.has_registers else [])
    header = ["block"]
    for p in pairs:
        header += [f"{p} before norm1", f"{p} after norm1"]
    header += ["owned channels", "norm1 gain owned/other"]
    rows = []
    for b, sim in enumerate(ln.similarity):
        row = [str(b)]
        for p in pairs:
            row += [num(_mean_at(sim, pt, p)) for pt in ("pre_ln1", "post_ln1")]
        row += [
            pct(_at(ln.owned_channel_fraction, b)),
            num(_at(ln.ln1_gain_owned_over_other, b)),
        ]
        rows.append(row)
    if ln.has_cls:
        pre, post = (
            _mean(_mean_at(sim, pt, "cls_patch") for sim in ln.similarity)
            for pt in ("pre_ln1", "post_ln1")
        )
        s.blocks.append(
            f"Mean [CLS]–patch cosine similarity over blocks: {num(pre)} before norm1, "
            f"{num(post)} after. A drop to about zero after norm1 means the norm separates [CLS] "
            "from patches (Marouani et al., ICLR 2026)."
        )
    s.blocks.append(
        f"Mean cosine similarity averaged over images; owned channels: "
        f"{text(ln.owned_threshold)}, measured at each block's input."
    )
    s.blocks.append(Table(header, rows))
    return s


def _mean_at(sim: dict[str, dict[str, Any]], point: str, pair: str) -> float | None:
    """The mean similarity of ``pair`` at ``point`` in one block (None: not measured)."""
    at = sim.get(point, {}).get(pair)
    return None if at is None else at.mean


def _features(r: DiagnoseResults) -> Section:
    s = Section("features", "The features: PCA colours and patch similarity")
    pics = r.feature_pictures
    if pics is None:
        s.blocks.append(_unavailable(r, "feature_pictures", "feature picture"))
        return s
    for p in pics.sites:
        share = ", ".join(pct(v) for v in p.pca.explained_variance) or "–"
        row, col = (text(_at(p.query_patch, i)) for i in (0, 1))
        s.blocks.append(
            f"At {code(p.site)} ({text(p.where)}): the first three principal "
            f"components of all {num(p.pca.n_patches)} patch tokens explain {share} "
            f"of the variance; the similarity map is the cosine similarity of patch (row {row}, "
            f"column {col}), the centre, to every patch of its image."
        )
    s.blocks += [f"No picture at {code(site)}: {text(why)}." for site, why in pics.skipped.items()]
    return s


def _mean(values: Iterable[Any]) -> float | None:
    v = [float(x) for x in values if finite(x)]
    return sum(v) / len(v) if v else None


def _not_applicable(r: DiagnoseResults) -> Section:
    s = Section("not_applicable", "What did not apply")
    s.blocks += [f"`{k}`: {v}" for k, v in r.not_applicable.items()] or [
        "Every analysis that ran applied."
    ]
    return s


def headlines(r: DiagnoseResults) -> list[Headline]:
    """The headline numbers of a diagnose run (its typed results), each at its pointer into
    ``results``."""
    return [
        *_verdict_headlines(r),
        *_rule_headlines(r),
        *_ratio_headlines(r),
        *_attention_headlines(r),
        *_redundancy_headlines(r),
        *_ln_headlines(r),
    ]


def _verdict_headlines(r: DiagnoseResults) -> list[Headline]:
    """The artifact verdict, the emergence layer and the outlier rate at the strongest layer."""
    n = "/results/norms"
    return [
        Headline("artifacts_present", f"{n}/artifacts_present", False, "the artifact verdict"),
        Headline(
            "emergence_layer",
            f"{n}/emergence_layer",
            None,
            "first layer with an outlier mode that persists; null: none",
        ),
        Headline(
            "outlier_rate",
            f"{n}/evidence/outlier_rate",
            False,
            "share of patch tokens in the outlier mode (auto rule) at the strongest layer; 0 "
            "without artifacts",
            unit="fraction",
            layer=r.norms.evidence.strongest_layer,
        ),
    ]


def _rule_headlines(r: DiagnoseResults) -> list[Headline]:
    """Each rule's outlier rate at the emergence layer (if any) and at the last layer."""
    norms, layers = r.norms, r.norms.layers
    picks = {"last_layer": len(layers) - 1}
    if norms.emergence_layer is not None:
        picks = {"emergence_layer": norms.emergence_layer, **picks}
    return [
        Headline(
            f"outlier_rate.{rule}.{where}",
            f"/results/norms/layers/{i}/outlier_rate/{rule}",
            False,
            f"patch tokens flagged by the {rule} rule, residual stream",
            unit="fraction",
            layer=layers[i].layer,
        )
        for where, i in picks.items()
        for rule in layers[i].outlier_rate
    ]


def _ratio_headlines(r: DiagnoseResults) -> list[Headline]:
    """The patch-norm ratios at the last layer, their peak over layers, after the final norm."""
    norms, layers = r.norms, r.norms.layers
    n = "/results/norms"
    out = []
    if layers:
        i = len(layers) - 1
        for ratio in ("max_over_median", "p98_over_median"):
            out.append(
                Headline(
                    f"norm_ratio.{ratio}.last_layer",
                    f"{n}/layers/{i}/{ratio}",
                    False,
                    "patch-token norm ratio on the residual stream",
                    layer=layers[i].layer,
                )
            )
        peak = max(range(len(layers)), key=lambda j: layers[j].max_over_median)
        out.append(
            Headline(
                "norm_ratio.max_over_median.peak",
                f"{n}/layers/{peak}/max_over_median",
                False,
                "largest max/median patch-norm ratio over layers (residual stream)",
                layer=layers[peak].layer,
            )
        )
    if norms.after_final_norm is not None:
        for ratio in ("max_over_median", "p98_over_median"):
            out.append(
                Headline(
                    f"norm_ratio.{ratio}.after_final_norm",
                    f"{n}/after_final_norm/{ratio}",
                    False,
                    "patch-token norm ratio after the final norm (outliers may vanish here)",
                )
            )
    return out


def _redundancy_headlines(r: DiagnoseResults) -> list[Headline]:
    """The redundancy AUC of outliers against normal patches (embedding, 4-neighbourhood)."""
    red = r.redundancy
    placed = red.outlier_vs_normal.get("embed_n4") if red is not None else None
    if red is None or placed is None or placed.auc is None:
        return []
    return [
        Headline(
            "redundancy_auc.embed_n4",
            "/results/redundancy/outlier_vs_normal/embed_n4/auc",
            None,
            "P(an outlier's embedding redundancy > a normal patch's): above 0.5, outliers "
            "sit in redundant regions",
            layer=red.layer,
        )
    ]


def _ln_headlines(r: DiagnoseResults) -> list[Headline]:
    """The [CLS]-patch similarity before and after LN1 and the owned channels (with a [CLS])."""
    if r.ln_separation is None or not r.ln_separation.has_cls:
        return []
    out = [
        Headline(
            f"cls_patch_similarity.{point}.mean_over_blocks",
            f"/results/ln_separation/similarity/*/{point}/cls_patch/mean",
            None,
            f"mean cosine [CLS]-patch similarity ({point}), averaged over blocks",
            aggregate="mean",
        )
        for point in ("pre_ln1", "post_ln1")
    ]
    out.append(
        Headline(
            "owned_channel_fraction.mean_over_blocks",
            "/results/ln_separation/owned_channel_fraction/*",
            None,
            "channels owned by [CLS] or patches (|log ratio| > log 4), averaged over blocks",
            unit="fraction",
            aggregate="mean",
        )
    )
    return out


def _attention_headlines(r: DiagnoseResults) -> list[Headline]:
    """Attention/norm agreement at the strongest outlier block (the last without artifacts):
    each score the results hold there."""
    layers, strongest = r.norms.layers, r.norms.evidence.strongest_layer
    shown = strongest if strongest is not None else len(layers) - 1
    agreement = r.attention.agreement if r.attention is not None else []
    site = layers[shown].site if layers else None
    i = next((j for j, a in enumerate(agreement) if a.norm_site == site), None)
    if i is None:
        return []
    at = agreement[i]
    return [
        Headline(
            f"attention_norm_{key}",
            f"/results/attention/agreement/{i}/{key}",
            None,
            f"{key} of attention-map artifacts against norm outliers "
            f"({at.norm_method} rule) at the strongest outlier layer "
            "(last layer without artifacts)",
            layer=layers[shown].layer,
        )
        for key in ("iou", "precision", "recall", "top_p_iou")
        if key in at.model_fields_set
    ]


def diagnose_document(result: DiagnoseResult, config: ConfigFile, command: str) -> Envelope:
    """The typed metrics.json document of a :class:`DiagnoseResult` (its results as typed),
    made with ``config``."""
    return build_document(
        "diagnose",
        result.results.model_dump(),
        headlines,
        command=command,
        described=model_info(result.model),
        data=result.data,
        config=config.to_file(),
        typed=result.results,
    )


def write_diagnose_run(
    out_dir: str | Path,
    result: DiagnoseResult,
    *,
    images: torch.Tensor | None = None,
    config: ConfigFile,
    command: str,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    max_maps: int = 8,
) -> Envelope:
    """Write the run directory of a :class:`DiagnoseResult`; the typed metrics.json document
    written.
    ``images`` (model input space) feed the overlays. ``mean``/``std`` (the model's data
    config) de-normalise ``images`` for display; without them images are taken as [0, 1] (or
    rescaled per image when outside)."""
    from vitreg.report.renderers.diagnose_figures import slider_data

    doc = diagnose_document(result, config, command)
    shown = display_images(images[:max_maps] if images is not None else None, mean, std)
    write_run(
        out_dir,
        doc,
        report,
        lambda: figures(result, shown),
        lambda _: slider_data(result, shown),
    )
    return doc


COMPARE_COLUMNS = (
    ("outlier_rate", "outlier rate"),
    ("emergence_layer", "emergence block"),
    ("norm_ratio.max_over_median.peak", "max/median norm"),
    ("attention_norm_iou", "attention-norm IoU"),
)


def model_rows(
    results: list[tuple[str, DiagnoseResult]],
) -> list[dict[str, str | int | float | None]]:
    """One row of headline numbers per model (its label, the numbers by headline name, the
    block of the norm-ratio peak, the verdict), from diagnose results labelled by model."""
    rows = []
    for label, result in results:
        found = plain(result.results.model_dump())
        marks = headlines(result.results)
        values = headline_values(found, marks)
        row: dict[str, str | int | float | None] = {"model": label}
        row |= {key: values.get(key) for key, _ in COMPARE_COLUMNS}
        peak = next((h for h in marks if h.name == "norm_ratio.max_over_median.peak"), None)
        row["max_over_median_layer"] = peak.layer if peak is not None else None
        row["verdict"] = "artifacts" if values["artifacts_present"] else "no artifacts"
        rows.append(row)
    return rows


def rows_table(rows: list[dict[str, str | int | float | None]]) -> Table:
    """The cross-model table of :func:`model_rows` (as comparison.json keeps them)."""
    return Table(
        ["model", *(title for _, title in COMPARE_COLUMNS), "verdict"],
        [
            [
                f"`{r['model']}`",
                pct(r["outlier_rate"]),
                num(r["emergence_layer"]),
                f"{num(r['norm_ratio.max_over_median.peak'])} "
                f"(block {num(r['max_over_median_layer'])})",
                num(r["attention_norm_iou"]),
                r["verdict"],
            ]
            for r in rows
        ],
    )


def figures(result: DiagnoseResult, images: np.ndarray | None) -> list[Figure]:
    """Every figure of a :class:`DiagnoseResult` its analyses support (a missing analysis
    gives no figure)."""
    res, traced = result.results, result.traced
    norms = traced.get("norms")
    figs: list[Figure] = []
    if isinstance(norms, NormsResult):
        figs += [norm_maps(norms, images), norm_quantiles(norms.summary), norm_histograms(norms)]
    attn = traced.get("attention")
    if isinstance(attn, AttentionResult):
        source = res.attention_source
        sources = [source] if isinstance(source, str) else list(source or [])
        figs += [
            attention_maps(
                attn, images, res.norms.emergence_layer, "/".join(sources or ["captured"])
            ),
            attention_agreement(attn.summary),
        ]
        if attn.last_layer_heads.numel():
            figs.insert(-1, attention_heads(attn, images))
    redundancy = traced.get("redundancy")
    if isinstance(redundancy, RedundancyResult):
        figs.append(redundancy_maps(redundancy, images))
    pictures = traced.get("feature_pictures")
    if isinstance(pictures, FeaturePicturesResult) and pictures.by_site:
        figs.append(feature_pictures(pictures, images))
    if res.ln_separation is not None:
        figs += [ln_similarity(res.ln_separation), channel_ownership(res.ln_separation)]
    return figs + kinds_figures(res)
