"""The report of ``vitreg fix``: its headlines, sections (the verdict after the fix per block,
before/after numbers and controls, the fix settings) and figures (norm maps, feature pictures,
attention maps, norm curves before and after), and the run directory written through the one
writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitreg.report.document import Headline, build_document
from vitreg.report.fields import as_dict, as_list, dig
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
    figure_section,
    model_section,
    num,
    pct,
    provenance_section,
    synthetic_banner,
    text,
)
from vitreg.report.verbs.neurons import blocks_text, images_section, planted_section
from vitreg.report.writer import write_run

MAX_ROWS = 4  # images shown in the before/after norm maps


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


def report(doc: dict[str, Any], figures: list[Figure]) -> Report:
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
            images_section(doc),
            model_section(doc),
            provenance_section(doc),
        ],
    )


def _fingerprint(n: dict[str, Any]) -> str:
    if n.get("fingerprint_matches") is None:
        return "not recorded"
    return "matches this model" if n["fingerprint_matches"] else "differs from this model's"


def headlines(results: dict[str, Any]) -> list[Headline]:
    """The headline numbers of a fix run at its detection layer, each at its pointer into
    ``results``."""
    c = "/results/comparison"
    layer = results["comparison"]["detect_layer"]
    out = [
        Headline(
            "clean_after",
            f"{c}/residual/clean",
            True,
            "no outlier mode at any block and max/median at the ordinary level",
        ),
        Headline(
            "max_over_median_after",
            f"{c}/residual/max_over_median_after/{layer}",
            False,
            "max/median patch norm after the fix",
            layer=layer,
        ),
        Headline(
            "outlier_rate_before", f"{c}/outlier_rate_before", False, unit="fraction", layer=layer
        ),  # fmt: skip
        Headline(
            "outlier_rate_after", f"{c}/outlier_rate_after", False, unit="fraction", layer=layer
        ),  # fmt: skip
        Headline("max_patch_norm_before", f"{c}/max_patch_norm_before/{layer}", False, layer=layer),
        Headline("max_patch_norm_after", f"{c}/max_patch_norm_after/{layer}", False, layer=layer),
        Headline("register_norm_after", f"{c}/register_norm_after/{layer}", None, layer=layer),
    ]
    if results["comparison"].get("pooled_cosine") is not None:
        out += [
            Headline(
                f"pooled_cosine_{stat}",
                f"{c}/pooled_cosine/{stat}",
                True,
                "cosine of the pooled embedding before vs after the fix",
            )
            for stat in ("mean", "min")
        ]
    return out


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
    doc = build_document(
        "fix",
        results,
        headlines(results),
        command=command,
        described=described,
        data=data,
        config=config,
    )
    return write_run(out_dir, doc, report, lambda: figures(comparison, doc, images))


def figures(comparison: Any, doc: dict[str, Any], images: Any) -> list[Figure]:
    """Norm maps, feature pictures and attention maps before/after, and the norm curves."""
    shown = display_images(images)
    drawn = [fix_norm_maps(comparison, shown), fix_norm_curves(doc["results"])]
    attention = fix_attention_maps(comparison, shown)
    if attention is not None:
        drawn.insert(1, attention)
    pictures = fix_feature_pictures(comparison, shown)
    if pictures is not None:
        drawn.insert(1, pictures)
    return drawn
