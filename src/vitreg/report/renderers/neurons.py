"""The report of ``vitreg neurons``: its headlines, sections (the verdict after the fix, how
each choice was made, the neurons with their causal effects) and figures (discovery scores,
the calibration curve), and the run directory written through the one writer."""

from __future__ import annotations

import math
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
    Report,
    Section,
    Table,
    code,
    figure_section,
    inline_text,
    num,
    pct,
    text,
)
from vitreg.report.render.plots import Figure, figure, new_canvas, outside_legend
from vitreg.report.writer import write_run
from vitreg.results.neurons import Calibration, NeuronRow, NeuronsResults, PlantedRow
from vitreg.results.schema import DataInfo, Envelope, ModelInfo
from vitreg.settings.base import ConfigFile


def neuron_scores(ranking: list[NeuronRow], chosen_k: int) -> Figure:
    """Discovery scores of every ranked neuron, coloured by layer, the chosen top-k marked."""
    fig = new_canvas(6.5, 3.4)
    fig.subplots_adjust(right=0.97)
    ax = fig.subplots()
    scores = np.array([r.score for r in ranking], dtype=float)
    layers = np.array([r.layer for r in ranking])
    ranks = np.arange(1, len(ranking) + 1)
    for i, layer in enumerate(sorted(set(layers.tolist()))):
        sel = layers == layer
        ax.scatter(ranks[sel], scores[sel], s=18, color=f"C{i % 10}", label=f"block {layer}")
    if chosen_k:
        ax.axvline(chosen_k + 0.5, color="k", ls=":", label=f"top-k = {chosen_k}")
    if len(scores) and scores.min() > 0:
        ax.set_yscale("log")
    ax.set_xlabel("rank")
    ax.set_ylabel("score (mean |activation| on outliers)")
    outside_legend(ax, ncol=1 + len(set(layers.tolist())) // 12)
    caption = (
        f"Discovery scores of the {len(ranking)} highest-ranked MLP units (`mlp.hook_post`), "
        "best first, coloured by block: each unit's mean activation over the outlier patches of an "
        "image, averaged over the images with outliers. The dotted line closes the chosen top-k."
    )
    return figure("neuron_scores", caption, fig)


def calibration_curve(curve: Calibration) -> Figure:
    """k against what the fix leaves on held-out images: blocks with an outlier mode, and the
    max/median patch norm at the detection layer against the allowed level."""
    from matplotlib.ticker import MaxNLocator

    fig = new_canvas(6.5, 5.0)
    mode_ax, norm_ax = fig.subplots(2, 1, sharex=True)
    fig.subplots_adjust(left=0.12, right=0.96, bottom=0.1, top=0.95, hspace=0.12)
    ks = curve.ks
    for key, blocks in curve.blocks_with_mode.items():
        size = "" if int(key) == 0 else f" ({key} px)"
        mode_ax.plot(ks, [len(b) for b in blocks], marker="o", label=f"blocks with a mode{size}")
        norm_ax.plot(ks, curve.max_over_median[key], marker="o", label=f"max/median{size}")
        allowed = curve.tolerance * curve.ordinary_max_over_median[key]
        norm_ax.axhline(allowed, color="r", ls=":", label=f"allowed{size}: {allowed:.3g}")
    for ax in (mode_ax, norm_ax):
        if curve.chosen_k is not None:
            ax.axvline(curve.chosen_k, color="k", ls=":")
        outside_legend(ax)
    mode_ax.set_ylabel("blocks with an outlier mode")
    mode_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    norm_ax.set_yscale("log")
    norm_ax.set_ylabel("max / median patch norm")
    norm_ax.set_xlabel("k (first neurons of the set moved into the register)")
    norm_ax.set_xticks(ks)  # ticks only at the k values measured
    caption = (
        "What the fix leaves on the held-out images with test-time registers on the first k "
        "neurons: the number of blocks whose patch norms still show an outlier mode (the presence "
        "test of `vitreg diagnose`, top) and the max/median patch norm at the detection layer "
        f"(`blocks.{curve.detect_layer}.hook_resid_post`, bottom) against the allowed level "
        f"({curve.tolerance:g}x the ordinary patches' level before the fix, red). The dotted "
        f"vertical line marks the chosen k ({curve.status})."
    )
    return figure("calibration_curve", caption, fig)


def report(doc: Envelope, figures: list[Figure]) -> Report:
    """report.md of ``vitreg neurons`` from its typed document: the verdict after the fix, how
    each choice was made, the neurons with their causal effects, figures, images, model."""
    r: NeuronsResults = doc.results
    held = r.held_out
    summary = Section("summary", "Register neurons")
    after = held.blocks_with_outlier_mode_after
    verdict = (
        "**No artifacts after the fix**: no block shows an outlier mode"
        if r.status == "clean"
        else f"**PARTIAL**: an outlier mode remains at blocks {blocks_text(after)}"
        if after
        else "**PARTIAL**: the largest patch norms stay above the ordinary level"
    )
    summary.blocks.append(
        f"{verdict} on the {held.n_images} held-out images with test-time registers "
        f"on these neurons (before: at blocks {blocks_text(held.blocks_with_outlier_mode_before)})"
        f". Max/median patch norm at block {r.detect_layer}: {num(held.max_over_median_before)}"
        f" → {num(held.max_over_median_after)} (ordinary patches: "
        f"{num(held.ordinary_max_over_median)}); patch outlier rate "
        f"{pct(held.outlier_rate_before)} → {pct(held.outlier_rate_after)}."
    )
    stable = r.stability
    if stable is not None:
        halves = [len(h) for h in stable.halves]
        summary.blocks.append(
            f"Stability: the causal set chosen from each half of the discovery images "
            f"({' and '.join(map(str, halves))} units) overlaps "
            f"{pct(stable.overlap_between_halves)} (Jaccard), and each overlaps the set "
            f"from all images {' and '.join(pct(x) for x in stable.overlap_with_whole)}"
            ". A low overlap says the ranking is noisy at this image count: use more images."
        )
    sizes = r.other_sizes.sizes if r.other_sizes is not None else []
    if sizes:
        summary.blocks.append(
            "Other sizes (the held-out images resized): "
            + "; ".join(
                f"{z.img_size} px "
                + ("clean" if z.clean_after else "**not clean**")
                + f", max/median {num(z.max_over_median_before)} → "
                f"{num(z.max_over_median_after)}"
                for z in sizes
            )
            + ". Register neurons can be resolution-specific: a set that does not clean a size "
            "should be found again at that size."
        )
    how = (
        "the units whose zeroing removes the outliers (causal check), their fix then checked on "
        "held-out images"
        if r.selection == "causal"
        else "fixed by --top-k (the paper's ranking)"
        if r.top_k_mode == "fixed"
        else "the smallest k of the paper's ranking whose fix passes on held-out images"
    )
    layers = ", ".join(str(x.layer) for x in r.layers) or "–"
    summary.blocks.append(f"**{r.n_neurons} register neurons** in blocks {layers}: {how}.")
    summary.blocks += [f"Note: {n}" for n in r.notes]
    if r.files.get("json"):
        apply = f"vitreg fix {doc.model.spec} --neurons {r.files['json']}"
        summary.blocks.append(
            f"Saved as {code(r.files['json'])} + {code(r.files.get('tensors'))}; apply them "
            f"with {code(apply)} (path relative to this run directory)."
        )
    return Report(
        synthetic_banner(doc),
        f"vitreg neurons: {inline_text(doc.model.spec)}",
        [
            summary,
            _decisions(r),
            _neuron_table(r),
            *([planted_section(r.planted)] if r.planted else []),
            figure_section("Scores and calibration", figures),
            images_section(doc),
            model_section(doc),
            provenance_section(doc),
        ],
    )


def _decisions(r: NeuronsResults) -> Section:
    """Each automatic choice with the reason the survey or the causal check gave."""
    s = Section("decisions", "How each choice was made")
    rows = [
        ["searched blocks", text(r.reasons.get("highest_layer"))],
        ["detection layer", text(r.reasons.get("detect_layer"))],
        ["threshold", text(r.reasons.get("threshold", r.threshold))],
    ]
    causal = r.causal
    if causal is not None:
        left = causal.residual_fraction
        rows.append(
            [
                "causal check",
                f"{causal.n_candidates} candidates of the ranking, {causal.n_images} held-out "
                f"images, {causal.passes} passes; {causal.baseline.n_outlier_patches} outlier "
                "patches; outlier excess left with the set zeroed: "
                f"{pct(max(left, 0.0) if math.isfinite(left) else None)} of the base",
            ]
        )
    if r.calibration is not None:
        rows.append(
            ["top-k", f"k = {r.chosen_k} ({r.calibration.status}): {r.calibration.criteria}"]
        )
    s.blocks.append(Table(["", "why"], rows))
    if causal is not None:
        s.blocks.append(
            "Causal effect: the share of the outlier excess at the detection layer (mean "
            "log-norm of the base outlier patches above the median, less the ordinary patches' "
            "level) that goes away when the unit is zeroed alone, and that comes back when it "
            "alone is restored with the rest of the set zeroed (in the set)."
        )
    return s


def _neuron_table(r: NeuronsResults) -> Section:
    s = Section("neurons", "The neurons")
    causal = r.causal is not None
    header = ["rank", "block", "unit", "score"] + (["effect alone", "in the set"] if causal else [])
    rows = []
    for i, n in enumerate(r.neurons):
        row = [str(i + 1), str(n.layer), str(n.unit), num(n.score)]
        if causal:
            row += [pct(n.effect_alone), pct(n.effect_in_set)]
        rows.append(row)
    s.blocks.append(Table(header, rows))
    dropped = r.causal.dropped if r.causal is not None else []
    if dropped:
        s.blocks.append("Dropped by the causal check:")
        s.blocks.append(
            Table(
                ["block", "unit", "effect alone", "in the set", "why"],
                [
                    [str(d.layer), str(d.unit), pct(d.alone), pct(d.in_set), text(d.reason)]
                    for d in dropped
                ],
            )
        )
    return s


def planted_section(rows: list[PlantedRow]) -> Section:
    """The planted fixture's units, their role, and whether the set includes them."""
    s = Section("planted", "Planted ground truth (synthetic model)")
    s.blocks.append(
        "The model is a planted fixture, so the truth is known: causes write the outliers, "
        "readers fire because a token already is one, distractors fire elsewhere, helpers "
        "(blocks 0-1) compute the flat-patch flag the causes read: zeroing them also removes "
        "the outliers, so discovery may rank them."
    )
    s.blocks.append(
        Table(
            ["block", "unit", "role", "in this set"],
            [[str(x.layer), str(x.unit), x.role, "yes" if x.chosen else "no"] for x in rows],
        )
    )
    return s


def images_section(doc: Envelope) -> Section:
    s = data_section(doc)
    split = getattr(doc.data, "split", None)  # the discovery / held-out split, where made
    if isinstance(split, dict) and split:
        s.blocks.insert(
            1,
            f"Split: {text(split.get('rule'))}: {num(split.get('n_discovery'))} images for "
            f"discovery, {num(split.get('n_held_out'))} held out.",
        )
    return s


def headlines(results: NeuronsResults) -> list[Headline]:
    """The headline numbers of a neurons run (its typed results), each at its pointer into
    ``results``."""
    out = [
        Headline("n_neurons", "/results/n_neurons", None, "register neurons kept"),
        Headline("chosen_k", "/results/chosen_k", None, "top-k (calibrated or fixed)"),
        Headline("detect_layer", "/results/detect_layer", None, "outlier detection layer"),
    ]
    for when in ("before", "after"):
        out.append(
            Headline(
                f"held_out_outlier_rate_{when}",
                f"/results/held_out/outlier_rate_{when}",
                False,
                f"patch outlier rate on held-out images {when} the fix at top-k",
                unit="fraction",
                layer=results.detect_layer,
            )
        )
    return out


def write_neurons_run(
    out_dir: str | Path,
    *,
    described: ModelInfo,
    data: DataInfo,
    config: ConfigFile,
    results: NeuronsResults,
    command: str,
) -> Envelope:
    """Write the ``vitreg neurons`` run directory (the NeuronSet files are the caller's); the
    typed metrics.json document written."""
    doc = build_document(
        "neurons",
        results,
        headlines,
        command=command,
        described=described,
        data=data,
        config=config.to_file(),
        typed=results,
    )
    write_run(out_dir, doc, report, lambda: figures(doc))
    return doc


def figures(doc: Envelope) -> list[Figure]:
    """The discovery scores and, when top-k was calibrated, the calibration curve."""
    r: NeuronsResults = doc.results
    drawn = [neuron_scores(r.ranking, r.chosen_k)]
    if r.calibration is not None:
        drawn.append(calibration_curve(r.calibration))
    return drawn


def blocks_text(blocks: list[Any]) -> str:
    """``[6, 7, 8, 10]`` -> ``6-8, 10``; ``[]`` -> ``none`` (an entry that is no block number
    is shown as it is)."""
    if not blocks:
        return "none"
    if not all(isinstance(b, int) for b in blocks):
        return ", ".join(map(text, blocks))
    runs = []
    start = prev = blocks[0]
    for b in blocks[1:]:
        if b != prev + 1:
            runs.append((start, prev))
            start = b
        prev = b
    runs.append((start, prev))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
