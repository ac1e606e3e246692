"""Run directories of ``vitreg neurons`` and ``vitreg fix``: config.yaml and metrics.json (first,
atomically; every headline number names the JSON pointer of the value it repeats in
``results``), then figures, report.md and report.html."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitreg.report.fields import as_dict, as_list, dig, finite
from vitreg.report.figures import (
    Figure,
    GridColumn,
    clip_range,
    display_images,
    figure,
    map_grid,
    new_canvas,
    outside_legend,
    similarity_column,
)
from vitreg.report.markdown import (
    Report,
    Section,
    Table,
    code,
    data_section,
    model_section,
    num,
    pct,
    provenance_section,
    text,
)
from vitreg.report.run_files import document, figure_section, synthetic_banner, write_files

MAX_ROWS = 4  # images shown in the before/after norm maps


# vitreg neurons -------------------------------------------------------------------------------
def neuron_scores(ranking: list[dict[str, Any]], chosen_k: int) -> Figure:
    """Discovery scores of every ranked neuron, coloured by layer, the chosen top-k marked."""
    fig = new_canvas(6.5, 3.4)
    fig.subplots_adjust(right=0.97)
    ax = fig.subplots()
    scores = np.array([r["score"] for r in ranking], dtype=float)
    layers = np.array([r["layer"] for r in ranking])
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
        "best first, coloured by layer: each unit's mean activation over the outlier patches of an "
        "image, averaged over the images with outliers. The dotted line closes the chosen top-k."
    )
    return figure("neuron_scores", caption, fig)


def calibration_curve(curve: dict[str, Any]) -> Figure:
    """k against what the fix leaves on held-out images: blocks with an outlier mode, and the
    max/median patch norm at the detection layer against the allowed level."""
    from matplotlib.ticker import MaxNLocator

    fig = new_canvas(6.5, 5.0)
    mode_ax, norm_ax = fig.subplots(2, 1, sharex=True)
    fig.subplots_adjust(left=0.12, right=0.96, bottom=0.1, top=0.95, hspace=0.12)
    ks = curve["ks"]
    for key, blocks in curve["blocks_with_mode"].items():
        size = "" if int(key) == 0 else f" ({key} px)"
        mode_ax.plot(ks, [len(b) for b in blocks], marker="o", label=f"blocks with a mode{size}")
        norm_ax.plot(ks, curve["max_over_median"][key], marker="o", label=f"max/median{size}")
        allowed = curve["tolerance"] * curve["ordinary_max_over_median"][key]
        norm_ax.axhline(allowed, color="r", ls=":", label=f"allowed{size}: {allowed:.3g}")
    for ax in (mode_ax, norm_ax):
        if curve["chosen_k"] is not None:
            ax.axvline(curve["chosen_k"], color="k", ls=":")
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
        f"(`blocks.{curve['detect_layer']}.hook_resid_post`, bottom) against the allowed level "
        f"({curve['tolerance']:g}x the ordinary patches' level before the fix, red). The dotted "
        f"vertical line marks the chosen k ({curve['status']})."
    )
    return figure("calibration_curve", caption, fig)


def neurons_report(doc: dict[str, Any], figures: list[Figure]) -> Report:
    """report.md of ``vitreg neurons``: the verdict after the fix, how each choice was made, the
    neurons with their causal effects, figures, images, model."""
    r = doc["results"]
    held = as_dict(r.get("held_out"))
    summary = Section("summary", "Register neurons")
    after = as_list(held.get("blocks_with_outlier_mode_after"))
    verdict = (
        "**No artifacts after the fix**: no block shows an outlier mode"
        if r["status"] == "clean"
        else f"**PARTIAL**: an outlier mode remains at blocks {blocks_text(after)}"
        if after
        else "**PARTIAL**: the largest patch norms stay above the ordinary level"
    )
    before = as_list(held.get("blocks_with_outlier_mode_before"))
    summary.blocks.append(
        f"{verdict} on the {num(held.get('n_images'))} held-out images with test-time registers "
        f"on these neurons (before: at blocks {blocks_text(before)}). Max/median patch norm at "
        f"block {r['detect_layer']}: {num(held.get('max_over_median_before'))} → "
        f"{num(held.get('max_over_median_after'))} (ordinary patches: "
        f"{num(held.get('ordinary_max_over_median'))}); patch outlier rate "
        f"{pct(held.get('outlier_rate_before'))} → {pct(held.get('outlier_rate_after'))}."
    )
    stable = as_dict(r.get("stability"))
    if stable:
        halves = [len(as_list(h)) for h in as_list(stable.get("halves"))]
        summary.blocks.append(
            f"Stability: the causal set chosen from each half of the discovery images "
            f"({' and '.join(map(str, halves))} units) overlaps "
            f"{pct(stable.get('overlap_between_halves'))} (Jaccard), and each overlaps the set "
            f"from all images {' and '.join(pct(x) for x in as_list(stable.get('overlap_with_whole')))}"
            ". A low overlap says the ranking is noisy at this image count: use more images."
        )
    sizes = as_list(dig(r.get("other_sizes"), "sizes"))
    if sizes:
        summary.blocks.append(
            "Other sizes (the held-out images resized): "
            + "; ".join(
                f"{num(dig(z, 'img_size'))} px "
                + ("clean" if dig(z, "clean_after") else "**not clean**")
                + f", max/median {num(dig(z, 'max_over_median_before'))} → "
                f"{num(dig(z, 'max_over_median_after'))}"
                for z in sizes
            )
            + ". Register neurons can be resolution-specific: a set that does not clean a size "
            "should be found again at that size."
        )
    how = (
        "the units whose zeroing removes the outliers (causal check), their fix then checked on "
        "held-out images"
        if r["selection"] == "causal"
        else "fixed by --top-k (the paper's ranking)"
        if r["top_k_mode"] == "fixed"
        else "the smallest k of the paper's ranking whose fix passes on held-out images"
    )
    layers = ", ".join(text(dig(x, "layer")) for x in as_list(r.get("layers"))) or "–"
    summary.blocks.append(f"**{r['n_neurons']} register neurons** in layers {layers}: {how}.")
    summary.blocks += [f"Note: {n}" for n in as_list(r.get("notes"))]
    files = as_dict(r.get("files"))
    if files.get("json"):
        apply = f"vitreg fix {doc['model']['spec']} --neurons {files['json']}"
        summary.blocks.append(
            f"Saved as {code(files['json'])} + {code(files.get('tensors'))}; apply them with "
            f"{code(apply)} (path relative to this run directory)."
        )
    return Report(
        synthetic_banner(doc),
        f"vitreg neurons: {doc['model']['spec']}",
        [
            summary,
            _decisions(r),
            _neuron_table(r),
            *([planted_section(r["planted"])] if as_list(r.get("planted")) else []),
            figure_section("Scores and calibration", figures),
            _images(doc),
            model_section(doc),
            provenance_section(doc),
        ],
    )


def _decisions(r: dict[str, Any]) -> Section:
    """Each automatic choice with the reason the survey or the causal check gave."""
    s = Section("decisions", "How each choice was made")
    reasons = as_dict(r.get("reasons"))
    rows = [
        ["searched blocks", text(reasons.get("highest_layer"))],
        ["detection layer", text(reasons.get("detect_layer"))],
        ["threshold", text(reasons.get("threshold", r.get("threshold")))],
    ]
    causal = as_dict(r.get("causal"))
    if causal:
        left = causal.get("residual_fraction")
        rows.append(
            [
                "causal check",
                f"{num(causal.get('n_candidates'))} candidates of the ranking, "
                f"{num(causal.get('n_images'))} held-out images, {num(causal.get('passes'))} "
                f"passes; {num(dig(causal, 'baseline', 'n_outlier_patches'))} outlier patches; "
                "outlier excess left with the set zeroed: "
                f"{pct(max(left, 0.0) if finite(left) else None)} of the base",
            ]
        )
    calibration = as_dict(r.get("calibration"))
    if calibration:
        rows.append(
            [
                "top-k",
                f"k = {r['chosen_k']} ({text(calibration.get('status'))}): "
                f"{text(calibration.get('criteria'))}",
            ]
        )
    s.blocks.append(Table(["", "why"], rows))
    if causal:
        s.blocks.append(
            "Causal effect: the share of the outlier excess at the detection layer (mean "
            "log-norm of the base outlier patches above the median, less the ordinary patches' "
            "level) that goes away when the unit is zeroed alone, and that comes back when it "
            "alone is restored with the rest of the set zeroed (in the set)."
        )
    return s


def _neuron_table(r: dict[str, Any]) -> Section:
    s = Section("neurons", "The neurons")
    causal = r.get("causal") is not None
    header = ["rank", "layer", "unit", "score"] + (["effect alone", "in the set"] if causal else [])
    rows = []
    for i, n in enumerate(map(as_dict, r["neurons"])):
        row = [str(i + 1), text(n.get("layer")), text(n.get("unit")), num(n.get("score"))]
        if causal:
            row += [pct(n.get("effect_alone")), pct(n.get("effect_in_set"))]
        rows.append(row)
    s.blocks.append(Table(header, rows))
    dropped = [as_dict(d) for d in as_list(dig(r, "causal", "dropped"))]
    if dropped:
        s.blocks.append("Dropped by the causal check:")
        s.blocks.append(
            Table(
                ["layer", "unit", "effect alone", "in the set", "why"],
                [
                    [
                        text(d.get("layer")),
                        text(d.get("unit")),
                        pct(d.get("alone")),
                        pct(d.get("in_set")),
                        text(d.get("reason")),
                    ]
                    for d in dropped
                ],
            )
        )
    return s


def planted_section(rows: list[dict[str, Any]]) -> Section:
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
            ["layer", "unit", "role", "in this set"],
            [
                [
                    text(x.get("layer")),
                    text(x.get("unit")),
                    text(x.get("role")),
                    "yes" if x.get("chosen") else "no",
                ]
                for x in map(as_dict, rows)
            ],
        )
    )
    return s


def _images(doc: dict[str, Any]) -> Section:
    s = data_section(doc)
    split = doc["data"].get("split")
    if isinstance(split, dict) and split:
        s.blocks.insert(
            1,
            f"Split: {text(split.get('rule'))}: {num(split.get('n_discovery'))} images for "
            f"discovery, {num(split.get('n_held_out'))} held out.",
        )
    return s


def write_neurons_run(
    out_dir: str | Path,
    *,
    described: dict[str, Any],
    data: dict[str, Any],
    config: dict[str, Any],
    results: dict[str, Any],
    command: str,
) -> Path:
    """Write the ``vitreg neurons`` run directory (the NeuronSet files are the caller's)."""
    pointers = [
        ("n_neurons", "/results/n_neurons", None, {"description": "register neurons kept"}),
        ("chosen_k", "/results/chosen_k", None, {"description": "top-k (calibrated or fixed)"}),
        ("detect_layer", "/results/detect_layer", None, {"description": "outlier detection layer"}),
    ]
    for when in ("before", "after"):
        pointers.append(
            (
                f"held_out_outlier_rate_{when}",
                f"/results/held_out/outlier_rate_{when}",
                False,
                {
                    "unit": "fraction",
                    "layer": results["detect_layer"],
                    "description": f"patch outlier rate on held-out images {when} the fix at top-k",
                },
            )
        )
    doc = document("neurons", command, described, data, config, results, pointers)
    return write_files(Path(out_dir), doc, lambda: neurons_figures(doc), neurons_report)


def neurons_figures(doc: dict[str, Any]) -> list[Figure]:
    """The discovery scores and, when top-k was calibrated, the calibration curve."""
    r = doc["results"]
    figures = [neuron_scores(r["ranking"], r["chosen_k"])]
    if r.get("calibration"):
        figures.append(calibration_curve(r["calibration"]))
    return figures


# vitreg fix -----------------------------------------------------------------------------------
def before_after_maps(
    name: str, before: np.ndarray, after: np.ndarray, images: np.ndarray | None, caption: str
) -> Figure:
    """Maps ``[n, h, w]`` before and after a fix, side by side (shared scale, then own scale)."""
    n = min(MAX_ROWS, len(before))
    lo, hi = clip_range(np.concatenate([before[:n], after[:n]]))
    own_lo, own_hi = clip_range(after[:n])
    columns = [
        GridColumn("before", before, vmin=lo, vmax=hi),
        GridColumn("after (same scale)", after, vmin=lo, vmax=hi),
        GridColumn("after (own scale)", after, vmin=own_lo, vmax=own_hi),
    ]
    scale = (
        " The first two maps share one colour scale (1st to 99th percentile of both, clipped); "
        "the last column is the fixed model on its own scale, to show what structure is left."
    )
    return map_grid(name, columns, images, caption + scale, cell=1.9)


def fix_norm_maps(comparison: Any, images: np.ndarray | None) -> Figure:
    """Patch norm maps at the detection layer before and after the fix, side by side."""
    trace_b, trace_a = comparison.before.trace, comparison.after.trace
    layer = comparison.detect_layer
    before = trace_b.patch_maps(trace_b.sites[layer]).numpy()
    after = trace_a.patch_maps(trace_a.sites[layer]).numpy()
    caption = (
        f"L2 norm of each patch token at layer {layer} (`{trace_b.sites[layer]}`, residual "
        "stream) over the first {n} images, without and with test-time registers."
    )
    return before_after_maps("fix_norm_maps", before, after, images, caption)


def fix_attention_maps(comparison: Any, images: np.ndarray | None) -> Figure | None:
    """Last-layer head-mean attention maps before and after the fix, side by side."""
    ab, aa = comparison.attention_before, comparison.attention_after
    if ab is None or aa is None:
        return None
    what = "[CLS] attention to each patch" if ab.query == "cls" else "mean attention received"
    caption = (
        f"{what} in the last layer (`{ab.sites[-1]}`, head mean) over the first {{n}} images, "
        "without and with test-time registers (the register's own column is not shown)."
    )
    before, after = ab.layer_maps[-1].numpy(), aa.layer_maps[-1].numpy()
    return before_after_maps("fix_attention_maps", before, after, images, caption)


def fix_feature_pictures(comparison: Any, images: np.ndarray | None) -> Figure | None:
    """PCA colours and centre-patch similarity before and after the fix, on one PCA basis: the
    base model's, fitted on all its patch tokens, so colours mean the same on both sides."""

    before, after = comparison.pictures_before, comparison.pictures_after
    if before is None or after is None or not before.by_site:
        return None
    columns, where = [], []
    for site, b in before.by_site.items():
        a = after.by_site.get(site)
        if a is None:
            continue
        label = "final norm" if b.where == "after the final norm" else site.split(".hook")[0]
        columns += [
            GridColumn(f"PCA before, {label}", b.basis.rgb(b.features)),
            GridColumn(f"PCA after, {label}", b.basis.rgb(a.features)),
        ]
        if b.where != "after the final norm":
            columns += [
                similarity_column(f"similarity before, {label}", b),
                similarity_column(f"similarity after, {label}", a),
            ]
        where.append(f"`{site}` ({b.where})")
    first = next(iter(before.by_site.values()))
    caption = (
        f"The patch features before and after the fix, at {' and '.join(where)}: the first "
        "three principal components as red, green and blue, fitted on all "
        f"{first.basis.n_patches} patch tokens of the model without the fix and applied to both "
        "(same basis, same colour range, so a colour means the same on both sides), and the "
        f"cosine similarity of the centre patch (green square) to every patch. Outliers are the "
        "patches of one saturated colour before the fix; after it they should look like their "
        "neighbours."
    )
    return map_grid("fix_feature_pictures", columns, images, caption)


def fix_norm_curves(results: dict[str, Any]) -> Figure:
    """Max and median patch norm per layer before/after, and the register's norm after."""
    c = results["comparison"]
    fig = new_canvas(6.5, 3.6)
    fig.subplots_adjust(right=0.97)
    ax = fig.subplots()
    x = list(range(len(c["max_patch_norm_before"])))
    ax.plot(x, c["max_patch_norm_before"], marker="o", color="C3", label="max patch, before")
    ax.plot(x, c["max_patch_norm_after"], marker="o", color="C0", label="max patch, after")
    ax.plot(x, c["median_patch_norm_before"], ls="--", color="C3", label="median, before")
    ax.plot(x, c["median_patch_norm_after"], ls="--", color="C0", label="median, after")
    ax.plot(x, c["register_norm_after"], marker="s", color="C2", label="test-time register, after")
    ax.axvline(c["detect_layer"], color="k", ls=":", label="detection layer")
    ax.set_yscale("log")
    ax.set_xlabel("block")
    ax.set_ylabel("token norm")
    outside_legend(ax)
    caption = (
        "Per layer, on the residual stream (block outputs, before the final norm): the largest "
        "and the median patch-token norm without (red) and with (blue) the fix, and the mean "
        "norm of the test-time register with the fix (green). The high norm should move from "
        "patches into the register."
    )
    return figure("fix_norm_curves", caption, fig)


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


def verdict_section(c: dict[str, Any]) -> Section:
    """The verdict after the fix, per block, by the diagnose presence test and max/median."""
    res = as_dict(c.get("residual"))
    layer = c.get("detect_layer")
    s = Section("verdict", "Verdict after the fix")
    ordinary = res.get("ordinary_max_over_median")
    level = (
        f"; the ordinary (non-outlier) patches before the fix reach {num(ordinary)}, and the "
        f"fix counts as clean up to {num(res.get('tolerance'))}× that"
        if ordinary is not None
        else ""
    )
    before = as_list(res.get("blocks_with_mode_before"))
    after = as_list(res.get("blocks_with_mode_after"))
    head = (
        "**No artifacts before the fix: nothing to remove.** No block shows an outlier mode "
        "without the fix either, so the fix can only change the model's output (the dense "
        "change is below)"
        if res.get("nothing_to_fix")
        else "**No artifacts after the fix**: no block shows an outlier mode"
        if res.get("clean")
        else f"**Artifacts remain after the fix**: an outlier mode at blocks {blocks_text(after)}"
        if after
        else "**Artifacts remain after the fix**: no outlier mode, but the largest patch norms "
        "stay above the ordinary level"
    )
    ratio_before = as_list(res.get("max_over_median_before"))
    ratio_after = as_list(res.get("max_over_median_after"))
    s.blocks.append(
        f"{head} (before: at blocks {blocks_text(before)}). Max/median patch norm at block "
        f"{text(layer)}: {num(_at(ratio_before, layer))} before, "
        f"{num(_at(ratio_after, layer))} after{level}. The outlier mode is the presence test of "
        "`vitreg diagnose` (a separate mode of patch norms, ≥ 3× the bulk)."
    )
    if res.get("threshold_from_another_model"):
        s.blocks.append(
            f"**The detection threshold belongs to another model**: the neuron set's threshold "
            f"({num(c.get('threshold_value'))}) is above every patch norm of this model at block "
            f"{text(layer)} (largest {num(res.get('largest_patch_norm_before'))}); the set was "
            "found on a different model or resolution. Rediscover on this one (`vitreg neurons`)."
        )
    rows = [
        [
            str(i),
            "yes" if i in before else "no",
            "yes" if i in after else "no",
            num(value),
            num(dig(ratio_after, i)),
        ]
        for i, value in enumerate(ratio_before)
    ]
    s.blocks.append(
        Table(
            ["block", "outlier mode before", "after", "max/median before", "after"],
            rows,
        )
    )
    return s


def _at(values: list[Any], layer: Any) -> Any:
    """``values[layer]`` for a layer index, None for no layer (or one out of range)."""
    return dig(values, layer) if isinstance(layer, int) else None


def _control_row(label: str, ctl: Any, outlier_rate: str | None = None) -> list[str]:
    """One row of the causal controls: neurons, outlier rate, pooled cosine to before."""
    ctl = as_dict(ctl)
    rate = outlier_rate if outlier_rate is not None else pct(ctl.get("outlier_rate"))
    return [label, text(ctl.get("n_neurons")), rate, num(dig(ctl, "pooled_cosine", "mean"))]


def fix_report(doc: dict[str, Any], figures: list[Figure]) -> Report:
    """report.md of ``vitreg fix``: the verdict after the fix per block, before/after numbers,
    the fix settings, figures, images."""
    r = doc["results"]
    c = r["comparison"]
    fx = as_dict(c.get("fix"))
    layer = c.get("detect_layer")
    s = Section("summary", "Before and after")
    cos = as_dict(c.get("pooled_cosine"))
    rows = [
        [
            f"patch outlier rate at layer {text(layer)}",
            pct(c.get("outlier_rate_before")),
            pct(c.get("outlier_rate_after")),
        ],
        [
            f"max patch norm at layer {text(layer)}",
            num(_at(as_list(c.get("max_patch_norm_before")), layer)),
            num(_at(as_list(c.get("max_patch_norm_after")), layer)),
        ],
        [
            f"test-time register norm at layer {text(layer)}",
            "–",
            num(_at(as_list(c.get("register_norm_after")), layer)),
        ],
        [
            "artifact verdict (diagnose rule)",
            num(c.get("verdict_before")),
            num(c.get("verdict_after")),
        ],
    ]
    s.blocks.append(Table(["", "before", "after"], rows))
    s.blocks.append(
        f"Outliers: patch tokens above the {code(c.get('rule'))} threshold "
        f"({num(c.get('threshold_value'))}) at `blocks.{text(layer)}.hook_resid_post` (residual "
        "stream), the neurons' detection layer."
    )
    if cos:
        s.blocks.append(
            f"Global information is kept: the cosine similarity between each image's pooled "
            f"embedding (`ln_final.hook_out`: [CLS], or the patch mean without one) before and "
            f"after the fix is {num(cos.get('mean'))} on average (lowest {num(cos.get('min'))}, "
            f"{num(cos.get('n'))} images)."
        )
    dense = as_dict(c.get("patch_cosine"))
    if dense:
        s.blocks.append(
            f"Dense output: the cosine similarity between each patch's final feature "
            f"(`ln_final.hook_out`) before and after the fix is {num(dense.get('mean'))} on "
            f"average and {num(dense.get('min'))} at the lowest ({num(dense.get('n'))} patches of "
            "the first images): what a dense head (segmentation, depth) sees change."
        )
    controls = as_dict(c.get("controls"))
    if controls:
        rows = [
            [
                "test-time registers",
                text(fx.get("n_neurons")),
                pct(c.get("outlier_rate_after")),
                num(cos.get("mean")),
            ],
            _control_row(
                "register neurons zeroed, no register", controls.get("ablate_register_neurons")
            ),
            _control_row("as many random neurons zeroed", controls.get("ablate_random_neurons")),
        ]
        shift = as_dict(controls.get("shift_to_patch"))
        if shift:
            share = pct(shift.get("share_of_images_with_top_norm_at_patch"))
            rows.append(
                _control_row(
                    "outlier moved to patch 0 (top-left)",
                    shift,
                    f"{pct(shift.get('outlier_rate'))} (top norm at patch 0 in {share} of images)",
                )
            )
        s.blocks.append(
            "Causal controls (the paper's: the neurons decide the outliers; a register keeps what they carry):"
        )
        s.blocks.append(
            Table(
                ["", "neurons", f"outlier rate at layer {text(layer)}", "pooled cosine to before"],
                rows,
            )
        )
    n = as_dict(r.get("neurons"))
    settings = Section("fix", "The fix")
    fix_layers = ", ".join(map(text, as_list(fx.get("layers")))) or "–"
    rows = [
        ["neurons", f"{text(fx.get('n_neurons'))} in layers {fix_layers}"],
        ["from", text(n.get("source"))],
        ["made for", code(n.get("model_spec"))],
        ["weights fingerprint", _fingerprint(n)],
        ["registers", text(fx.get("n_registers"))],
        ["[CLS]", text(fx.get("cls"))],
        ["patches", text(fx.get("patches"))],
        ["mode", text(fx.get("mode"))],
        ["seed", text(fx.get("seed"))],
    ]
    settings.blocks.append(Table(["", ""], rows))
    if r.get("saved"):
        load = f'vitreg.load("local:{r["saved"]}")'
        settings.blocks.append(
            f"Saved to {code(r['saved'])}: {code(load)} loads it with the fix applied; timm's "
            "own API loads the same weights without the fix."
        )
    return Report(
        synthetic_banner(doc),
        f"vitreg fix: {doc['model']['spec']}",
        [
            verdict_section(c),
            s,
            settings,
            *([planted_section(r["planted"])] if as_list(r.get("planted")) else []),
            figure_section("Figures", figures),
            _images(doc),
            model_section(doc),
            provenance_section(doc),
        ],
    )


def _fingerprint(n: dict[str, Any]) -> str:
    if n.get("fingerprint_matches") is None:
        return "not recorded"
    return "matches this model" if n["fingerprint_matches"] else "differs from this model's"


def write_fix_run(
    out_dir: str | Path,
    comparison: Any,
    *,
    described: dict[str, Any],
    data: dict[str, Any],
    config: dict[str, Any],
    results: dict[str, Any],
    command: str,
    images: Any = None,
) -> Path:
    """Write the ``vitreg fix`` run directory; ``images`` are display copies in [0, 1]."""
    results = {"comparison": comparison.to_dict(), **results}
    layer = comparison.detect_layer
    c = "/results/comparison"
    at = {"layer": layer}
    pointers = [
        (
            "clean_after",
            f"{c}/residual/clean",
            True,
            {"description": "no outlier mode at any block and max/median at the ordinary level"},
        ),
        (
            "max_over_median_after",
            f"{c}/residual/max_over_median_after/{layer}",
            False,
            {"description": "max/median patch norm after the fix", **at},
        ),
        ("outlier_rate_before", f"{c}/outlier_rate_before", False, {"unit": "fraction", **at}),
        ("outlier_rate_after", f"{c}/outlier_rate_after", False, {"unit": "fraction", **at}),
        ("max_patch_norm_before", f"{c}/max_patch_norm_before/{layer}", False, at),
        ("max_patch_norm_after", f"{c}/max_patch_norm_after/{layer}", False, at),
        ("register_norm_after", f"{c}/register_norm_after/{layer}", None, at),
    ]
    if comparison.pooled_cosine is not None:
        for stat in ("mean", "min"):
            pointers.append(
                (
                    f"pooled_cosine_{stat}",
                    f"{c}/pooled_cosine/{stat}",
                    True,
                    {"description": "cosine of the pooled embedding before vs after the fix"},
                )
            )
    doc = document("fix", command, described, data, config, results, pointers)
    return write_files(Path(out_dir), doc, lambda: fix_figures(comparison, doc, images), fix_report)


def fix_figures(comparison: Any, doc: dict[str, Any], images: Any) -> list[Figure]:
    """Norm maps, feature pictures and attention maps before/after, and the norm curves."""
    shown = display_images(images)
    figures = [fix_norm_maps(comparison, shown), fix_norm_curves(doc["results"])]
    attention = fix_attention_maps(comparison, shown)
    if attention is not None:
        figures.insert(1, attention)
    pictures = fix_feature_pictures(comparison, shown)
    if pictures is not None:
        figures.insert(1, pictures)
    return figures
