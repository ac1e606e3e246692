"""The report of ``vitreg fix``: its headlines, sections (the verdict after the fix per block,
before/after numbers and controls, the fix settings) and figures (norm maps, feature pictures,
attention maps, norm curves before and after), and the run directory written through the one
writer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vitreg.report.document import Headline, build_document
from vitreg.report.render.envelope import model_section, provenance_section, synthetic_banner
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
from vitreg.report.render.plots import (
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
from vitreg.report.renderers.neurons import blocks_text, images_section, planted_section
from vitreg.report.writer import write_run
from vitreg.results.fix import Comparison, Control, FixResults
from vitreg.results.schema import DataInfo, Envelope, ModelInfo
from vitreg.settings.base import ConfigFile

if TYPE_CHECKING:
    from vitreg.fix.compare import FixComparison

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


def fix_norm_maps(comparison: FixComparison, images: np.ndarray | None) -> Figure:
    """Patch norm maps at the detection layer before and after the fix, side by side."""
    trace_b, trace_a = comparison.before.trace, comparison.after.trace
    layer = comparison.results.detect_layer
    before = trace_b.patch_maps(trace_b.sites[layer]).numpy()
    after = trace_a.patch_maps(trace_a.sites[layer]).numpy()
    caption = (
        f"L2 norm of each patch token at block {layer} (`{trace_b.sites[layer]}`, residual "
        "stream) over the first {n} images, without and with test-time registers."
    )
    return before_after_maps("fix_norm_maps", before, after, images, caption)


def fix_attention_maps(comparison: FixComparison, images: np.ndarray | None) -> Figure | None:
    """Last-layer head-mean attention maps before and after the fix, side by side."""
    ab, aa = comparison.attention_before, comparison.attention_after
    if ab is None or aa is None:
        return None
    what = (
        "[CLS] attention to each patch" if ab.summary.query == "cls" else "mean attention received"
    )
    caption = (
        f"{what} in the last block (`{ab.summary.sites[-1]}`, head mean) over the first {{n}} images, "
        "without and with test-time registers (the register's own column is not shown)."
    )
    before, after = ab.layer_maps[-1].numpy(), aa.layer_maps[-1].numpy()
    return before_after_maps("fix_attention_maps", before, after, images, caption)


def fix_feature_pictures(comparison: FixComparison, images: np.ndarray | None) -> Figure | None:
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
        final = b.summary.where == "after the final norm"
        label = "final norm" if final else site.split(".hook")[0]
        columns += [
            GridColumn(f"PCA before, {label}", b.basis.rgb(b.features)),
            GridColumn(f"PCA after, {label}", b.basis.rgb(a.features)),
        ]
        if not final:
            columns += [
                similarity_column(f"similarity before, {label}", b),
                similarity_column(f"similarity after, {label}", a),
            ]
        where.append(f"`{site}` ({b.summary.where})")
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


def fix_norm_curves(c: Comparison) -> Figure:
    """Max and median patch norm per layer before/after, and the register's norm after."""
    fig = new_canvas(6.5, 3.6)
    fig.subplots_adjust(right=0.97)
    ax = fig.subplots()
    x = list(range(len(c.max_patch_norm_before)))
    ax.plot(x, c.max_patch_norm_before, marker="o", color="C3", label="max patch, before")
    ax.plot(x, c.max_patch_norm_after, marker="o", color="C0", label="max patch, after")
    ax.plot(x, c.median_patch_norm_before, ls="--", color="C3", label="median, before")
    ax.plot(x, c.median_patch_norm_after, ls="--", color="C0", label="median, after")
    ax.plot(x, c.register_norm_after, marker="s", color="C2", label="test-time register, after")
    ax.axvline(c.detect_layer, color="k", ls=":", label="detection layer")
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


def verdict_section(c: Comparison) -> Section:
    """The verdict after the fix, per block, by the diagnose presence test and max/median."""
    res, layer = c.residual, c.detect_layer
    s = Section("verdict", "Verdict after the fix")
    ordinary = res.ordinary_max_over_median
    level = (
        f"; the ordinary (non-outlier) patches before the fix reach {num(ordinary)}, and the "
        f"fix counts as clean up to {num(res.tolerance)}× that"
        if ordinary is not None
        else ""
    )
    before, after = res.blocks_with_mode_before, res.blocks_with_mode_after
    head = (
        "**No artifacts before the fix: nothing to remove.** No block shows an outlier mode "
        "without the fix either, so the fix can only change the model's output (the dense "
        "change is below)"
        if res.nothing_to_fix
        else "**No artifacts after the fix**: no block shows an outlier mode"
        if res.clean
        else f"**Artifacts remain after the fix**: an outlier mode at blocks {blocks_text(after)}"
        if after
        else "**Artifacts remain after the fix**: no outlier mode, but the largest patch norms "
        "stay above the ordinary level"
    )
    ratio_before, ratio_after = res.max_over_median_before, res.max_over_median_after
    s.blocks.append(
        f"{head} (before: at blocks {blocks_text(before)}). Max/median patch norm at block "
        f"{layer}: {num(_at(ratio_before, layer))} before, "
        f"{num(_at(ratio_after, layer))} after{level}. The outlier mode is the presence test of "
        "`vitreg diagnose` (a separate mode of patch norms, ≥ 3× the bulk)."
    )
    if res.threshold_from_another_model:
        s.blocks.append(
            f"**The detection threshold belongs to another model**: the neuron set's threshold "
            f"({num(c.threshold_value)}) is above every patch norm of this model at block "
            f"{layer} (largest {num(res.largest_patch_norm_before)}); the set was "
            "found on a different model or resolution. Rediscover on this one (`vitreg neurons`)."
        )
    rows = [
        [
            str(i),
            "yes" if i in before else "no",
            "yes" if i in after else "no",
            num(value),
            num(_at(ratio_after, i)),
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


def _at(values: list[Any], i: int) -> Any:
    """``values[i]``, None where the list is shorter."""
    return values[i] if 0 <= i < len(values) else None


def _control_row(label: str, ctl: Control | None, outlier_rate: str | None = None) -> list[str]:
    """One row of the causal controls: neurons, outlier rate, pooled cosine to before."""
    if ctl is None:
        return [label, "–", outlier_rate or "–", "–"]
    rate = outlier_rate if outlier_rate is not None else pct(ctl.outlier_rate)
    cos = ctl.pooled_cosine.mean if ctl.pooled_cosine is not None else None
    return [label, text(ctl.n_neurons), rate, num(cos)]


def report(doc: Envelope, figures: list[Figure]) -> Report:
    """report.md of ``vitreg fix`` from its typed document: the verdict after the fix per
    block, before/after numbers, the fix settings, figures, images."""
    r: FixResults = doc.results
    return Report(
        synthetic_banner(doc),
        f"vitreg fix: {inline_text(doc.model.spec)}",
        [
            verdict_section(r.comparison),
            _summary_section(r.comparison),
            _settings_section(r),
            *([planted_section(r.planted)] if r.planted else []),
            figure_section("Figures", figures),
            images_section(doc),
            model_section(doc),
            provenance_section(doc),
        ],
    )


def _summary_section(c: Comparison) -> Section:
    """Before and after: the numbers at the detection layer, what is kept, the causal controls."""
    layer = c.detect_layer
    s = Section("summary", "Before and after")
    rows = [
        [
            f"patch outlier rate at block {layer}",
            pct(c.outlier_rate_before),
            pct(c.outlier_rate_after),
        ],
        [
            f"max patch norm at block {layer}",
            num(_at(c.max_patch_norm_before, layer)),
            num(_at(c.max_patch_norm_after, layer)),
        ],
        [
            f"test-time register norm at block {layer}",
            "–",
            num(_at(c.register_norm_after, layer)),
        ],
        ["artifact verdict (diagnose rule)", num(c.verdict_before), num(c.verdict_after)],
    ]
    s.blocks.append(Table(["", "before", "after"], rows))
    s.blocks.append(
        f"Outliers: patch tokens above the {code(c.rule)} threshold "
        f"({num(c.threshold_value)}) at `blocks.{layer}.hook_resid_post` (residual "
        "stream), the neurons' detection layer."
    )
    s.blocks += _kept_blocks(c)
    if c.controls:
        s.blocks.append(
            "Causal controls (the paper's: the neurons decide the outliers; a register keeps what they carry):"
        )
        s.blocks.append(_controls_table(c))
    return s


def _kept_blocks(c: Comparison) -> list[str]:
    """What the fix keeps: the pooled embedding's and the dense output's cosine to before."""
    out = []
    cos = c.pooled_cosine
    if cos is not None:
        out.append(
            f"Global information is kept: the cosine similarity between each image's pooled "
            f"embedding (`ln_final.hook_out`: [CLS], or the patch mean without one) before and "
            f"after the fix is {num(cos.mean)} on average (lowest {num(cos.min)}, "
            f"{num(cos.n)} images)."
        )
    dense = c.patch_cosine
    if dense is not None:
        out.append(
            f"Dense output: the cosine similarity between each patch's final feature "
            f"(`ln_final.hook_out`) before and after the fix is {num(dense.mean)} on "
            f"average and {num(dense.min)} at the lowest ({num(dense.n)} patches of "
            "the first images): what a dense head (segmentation, depth) sees change."
        )
    return out


def _controls_table(c: Comparison) -> Table:
    """The causal controls against the fix: neurons, outlier rate, pooled cosine to before."""
    controls, cos = c.controls, c.pooled_cosine
    rows = [
        [
            "test-time registers",
            text(c.fix.n_neurons),
            pct(c.outlier_rate_after),
            num(cos.mean if cos is not None else None),
        ],
        _control_row(
            "register neurons zeroed, no register", controls.get("ablate_register_neurons")
        ),
        _control_row("as many random neurons zeroed", controls.get("ablate_random_neurons")),
    ]
    shift = controls.get("shift_to_patch")
    if shift is not None:
        share = pct(shift.share_of_images_with_top_norm_at_patch)
        rows.append(
            _control_row(
                "outlier moved to patch 0 (top-left)",
                shift,
                f"{pct(shift.outlier_rate)} (top norm at patch 0 in {share} of images)",
            )
        )
    return Table(
        ["", "neurons", f"outlier rate at block {c.detect_layer}", "pooled cosine to before"],
        rows,
    )


def _settings_section(r: FixResults) -> Section:
    """The fix: its neurons and where they come from, its settings, where it was saved."""
    fx, n = r.comparison.fix, r.neurons
    settings = Section("fix", "The fix")
    rows = [
        ["neurons", f"{fx.n_neurons} in layers {', '.join(map(str, fx.layers)) or '–'}"],
        ["from", text(n.source)],
        ["made for", code(n.model_spec)],
        ["weights fingerprint", _fingerprint(n.fingerprint_matches)],
        ["registers", text(fx.n_registers)],
        ["[CLS]", text(fx.cls)],
        ["patches", text(fx.patches)],
        ["mode", text(fx.mode)],
        ["seed", text(fx.seed)],
    ]
    settings.blocks.append(Table(["", ""], rows))
    if r.saved:
        load = f'vitreg.load("local:{r.saved}")'
        settings.blocks.append(
            f"Saved to {code(r.saved)}: {code(load)} loads it with the fix applied; timm's "
            "own API loads the same weights without the fix."
        )
    return settings


def _fingerprint(matches: bool | None) -> str:
    if matches is None:
        return "not recorded"
    return "matches this model" if matches else "differs from this model's"


def headlines(results: FixResults) -> list[Headline]:
    """The headline numbers of a fix run (its typed results) at its detection layer, each at
    its pointer into ``results``."""
    c = "/results/comparison"
    layer = results.comparison.detect_layer
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
    if results.comparison.pooled_cosine is not None:
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
    comparison: FixComparison,
    *,
    described: ModelInfo,
    data: DataInfo,
    config: ConfigFile,
    results: FixResults,
    command: str,
    images: torch.Tensor | None = None,
) -> Envelope:
    """Write the ``vitreg fix`` run directory: ``results`` (holding ``comparison.results``),
    and the figures of the traces ``comparison`` kept (``images``: display copies in [0, 1]);
    the typed metrics.json document written."""
    doc = build_document(
        "fix",
        results.model_dump(mode="json"),
        headlines,
        command=command,
        described=described,
        data=data,
        config=config.to_file(),
        typed=results,
    )
    write_run(out_dir, doc, report, lambda: figures(comparison, doc, images))
    return doc


def figures(comparison: FixComparison, doc: Envelope, images: torch.Tensor | None) -> list[Figure]:
    """Norm maps, feature pictures and attention maps before/after (from the ``comparison``
    measured), and the norm curves (from the typed document)."""
    shown = display_images(images)
    drawn = [
        fix_norm_maps(comparison, shown),
        fix_norm_curves(doc.results.comparison),
    ]
    attention = fix_attention_maps(comparison, shown)
    if attention is not None:
        drawn.insert(1, attention)
    pictures = fix_feature_pictures(comparison, shown)
    if pictures is not None:
        drawn.insert(1, pictures)
    return drawn
