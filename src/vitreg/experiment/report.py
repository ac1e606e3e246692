"""The comparison report of ``vitreg experiment variants``: metrics.json (every headline traced to
``results``), report.md, report.html and figures, rewritten after each variant.

The "What can and cannot be concluded" section is written from the numbers: it states the
scale, whether seed-to-seed noise was measured, the specialisation deltas per high-norm
handling and whether their signs agree, the measured costs, and the artifact verdicts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from vitreg.experiment.grid import HANDLING_TITLES, SPECIALISATION_TITLES
from vitreg.experiment.record import ExperimentPlan
from vitreg.experiment.summary import SUMMARY
from vitreg.report.document import Headline, build_document
from vitreg.report.render.envelope import provenance_section
from vitreg.report.render.markdown import (
    Report,
    Section,
    Table,
    code,
    figure_section,
    finite,
    num,
    text,
)
from vitreg.report.render.plots import Figure, figure, new_canvas, outside_legend
from vitreg.report.renderers.train import dino_reading
from vitreg.report.writer import write_run
from vitreg.results.experiment import AS_GIVEN, ExperimentResults, Timing, VariantSummary
from vitreg.results.schema import Envelope, ModelDescription, data_info, model_info

COLUMNS = (  # summary key, column title
    ("params", "params"),
    ("params_extra_pct", "extra params %"),
    ("flops", "MFLOPs"),
    ("cls_top1", "[CLS] top-1 ↑"),
    ("patch_mean_top1", "mean-patch top-1 ↑"),
    ("seg_miou", "seg mIoU ↑"),
    ("depth_rmse", "depth RMSE ↓"),
    ("artifacts_present", "artifacts"),
    ("outlier_rate", "outlier rate"),
    ("cls_patch_post_ln1", "[CLS]/patch cos after LN1"),
    ("final_loss", "final loss"),
)
DELTAS = (("seg_miou", "Δ mIoU"), ("depth_rmse", "Δ depth RMSE"), ("cls_top1", "Δ [CLS] top-1"))
SETTINGS = ("depth", "embed_dim", "num_heads", "patch_size", "img_size", "init_values", "recipe")
SETTINGS += ("steps", "batch_size", "lr", "seeds", "probe_seeds")  # the summary names these


def headlines(results: ExperimentResults) -> list[Headline]:
    """``<variant>/<key>`` -> the mean over seeds in ``results.variants[i].summary``."""
    return [
        Headline(f"{v.name}/{key}", f"/results/variants/{i}/summary/{key}/mean", better)
        for i, v in enumerate(results.variants)
        for key, (_, better) in SUMMARY.items()
        if _mean(v, key) is not None
    ]


def _mean(v: VariantSummary, key: str) -> float | None:
    """The mean over seeds of the summary number ``key`` (None: not measured)."""
    stats = v.summary.get(key)
    return stats.mean if stats is not None else None


def _cell(v: VariantSummary, key: str) -> str:
    stats = v.summary.get(key)
    mean = stats.mean if stats is not None else None
    if stats is None or not finite(mean):
        return num(mean)
    if key == "artifacts_present":
        return "yes" if mean >= 0.5 else "no"
    if key == "params":
        return f"{mean / 1e6:.3f}M"
    if key == "flops":
        return f"{mean / 1e6:.1f}"
    if key == "params_extra_pct":
        return f"{mean:.2f}"
    return f"{num(mean)} ± {num(stats.std, 2)}" if stats.std is not None else num(mean)


def _titled(titles: dict[str, str], key: Any) -> str:
    """A specialisation's or a high-norm handling's title (the key itself if it has none)."""
    return titles.get(key, text(key)) if isinstance(key, str) else text(key)


def comparison_table(variants: list[VariantSummary]) -> Table:
    header = ["variant", "specialised", "high-norm handling", *(t for _, t in COLUMNS)]
    rows = [
        [
            code(v.name),
            _titled(SPECIALISATION_TITLES, v.specialisation),
            _titled(HANDLING_TITLES, v.handling),
            *(_cell(v, k) for k, _ in COLUMNS),
        ]
        for v in variants
    ]
    return Table(header, rows)


def deltas(variants: list[VariantSummary]) -> dict[str, dict[str, dict[str, float | None]]]:
    """``{specialisation: {handling: {key: variant - baseline of the same handling}}}``."""
    by = {(v.specialisation, v.handling): v for v in variants}
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for (spec, handling), v in by.items():
        base = by.get(("baseline", handling))
        if spec in ("norm_ls", "qkv") and base is not None:
            out.setdefault(spec, {})[handling] = {
                key: (
                    _mean(v, key) - _mean(base, key)
                    if _mean(v, key) is not None and _mean(base, key) is not None
                    else None
                )
                for key, _ in DELTAS
            }
    return out


def delta_table(d: dict[str, dict[str, dict[str, float | None]]]) -> Table:
    rows = [
        [
            _titled(SPECIALISATION_TITLES, spec),
            _titled(HANDLING_TITLES, h),
            *(num(vals[k]) for k, _ in DELTAS),
        ]
        for spec, per in d.items()
        for h, vals in per.items()
    ]
    return Table(["variant", "high-norm handling", *(t for _, t in DELTAS)], rows)


def block_table(variants: list[VariantSummary]) -> Table | None:
    with_ln = [
        (v.name, v.per_block["cls_patch_post_ln1"])
        for v in variants
        if "cls_patch_post_ln1" in v.per_block
    ]
    if not with_ln:
        return None
    depth = max(len(values) for _, values in with_ln)
    rows = [
        [code(name), *(num(values[b] if b < len(values) else None, 2) for b in range(depth))]
        for name, values in with_ln
    ]
    return Table(["variant", *(f"block {b}" for b in range(depth))], rows)


def _pooled_std(variants: list[VariantSummary], key: str) -> float | None:
    stds = [stats.std for v in variants if (stats := v.summary.get(key)) is not None]
    var = [std**2 for std in stds if std is not None]
    return math.sqrt(sum(var) / len(var)) if var else None


def conclusions(results: ExperimentResults) -> list[str]:
    """Plain statements of what the numbers support, and what they cannot."""
    variants = results.variants
    noise = _pooled_std(variants, "seg_miou")
    out: list[str | None] = [_scale(results), _noise(results.settings.seeds, noise)]
    out += floors(results)
    out += [_delta_line(spec, per, noise) for spec, per in deltas(variants).items()]
    out += [_cost(variants), _artifacts(variants), _dino(variants), _ln_separation(variants)]
    return [line for line in out if line is not None]  # None: not measured in these runs


def _scale(results: ExperimentResults) -> str:
    """The scale of the runs against the paper's, and what these runs can show."""
    s = results.settings
    return (
        f"**Scale.** Every variant is a {s.depth}-block, {s.embed_dim}-wide ViT "
        f"(patch {s.patch_size}, {s.img_size} px) trained from scratch for {s.steps} "
        f"steps of {s.batch_size} images ({s.recipe}) on `{results.data}`. The paper's "
        "claims (> 2 mIoU on ADE20k, unchanged classification) concern ViT-S/B/L trained for "
        "hundreds of thousands of steps on natural images; these runs cannot confirm or refute "
        "them. They show that every variant trains, is probed and diagnosed end to end, what "
        "each option costs, and the direction of the effects at this toy scale."
    )


def _noise(seeds: int, noise: float | None) -> str:
    """Whether seed-to-seed noise was measured, and how large a difference it covers."""
    if seeds == 1 or noise is None:
        return (
            "**Noise.** Each variant was trained once (one seed), so seed-to-seed variation is "
            "not measured; probe ± values (if any) only cover probe training. Differences of a "
            "few mIoU points here can be seed noise: rerun with `--seeds 3` before reading them."
        )
    return (
        f"**Noise.** Over {seeds} training seeds the pooled std of seg mIoU is {num(noise)}; "
        f"a difference under about {num(2 * noise)} (2 std) is within seed noise."
    )


def _delta_line(
    spec: str, per: dict[str, dict[str, float | None]], noise: float | None
) -> str | None:
    """One specialisation's seg mIoU deltas per high-norm handling, whether their signs agree
    and which exceed seed noise (None: no delta measured)."""
    vals = {h: x["seg_miou"] for h, x in per.items() if x["seg_miou"] is not None}
    if not vals:
        return None
    shown = ", ".join(f"{num(x)} ({HANDLING_TITLES[h]})" for h, x in vals.items())
    signs = {math.copysign(1, x) for x in vals.values() if x}
    agree = (
        "no change under any high-norm handling"
        if not signs
        else "the sign is mixed across high-norm handlings"
        if len(signs) > 1
        else "the sign agrees across high-norm handlings"
        if len(vals) > 1
        else "a single comparison"
    )
    within = ""
    if noise is not None:
        big = [h for h, x in vals.items() if abs(x) > 2 * noise]
        within = (
            f"; beyond 2 seed std: {', '.join(HANDLING_TITLES[h] for h in big)}"
            if big
            else "; all within 2 seed std"
        )
    return f"**{SPECIALISATION_TITLES[spec]} vs baseline.** Δ seg mIoU = {shown}: {agree}{within}."


def _cost(variants: list[VariantSummary]) -> str | None:
    """The measured extra parameters of each specialisation, and whether FLOPs change."""
    costs = {
        v.specialisation: _mean(v, "params_extra_pct")
        for v in variants
        if v.handling == "none" and v.specialisation in ("norm_ls", "qkv")
    }
    if not costs:
        return None
    flops_same = all(_mean(v, "flops_delta_specialisation") == 0 for v in variants)
    shown = ", ".join(f"{SPECIALISATION_TITLES[k]} +{num(p)}%" for k, p in costs.items())
    return (
        f"**Cost.** Extra parameters: {shown} (the paper's ≈0.05% / ≈8% are for ViT-L; "
        "norm and LayerScale copies weigh more in a narrow model). Specialisation changes "
        + ("no FLOPs in any variant (measured)." if flops_same else "FLOPs in some variants.")
    )


def _artifacts(variants: list[VariantSummary]) -> str:
    """The variants with high-norm outlier tokens, and what their absence says."""
    flagged = [v.name for v in variants if (_mean(v, "artifacts_present") or 0) >= 0.5]
    return (
        f"**Artifacts.** High-norm outlier tokens were found in {len(flagged)} of "
        f"{len(variants)} variants"
        + (f" ({', '.join(flagged)})." if flagged else ".")
        + (
            " Outliers emerge in large models trained long; at this length their absence says "
            "nothing about whether registers or attention bias remove them."
            if not flagged
            else ""
        )
    )


def _dino(variants: list[VariantSummary]) -> str | None:
    """The [CLS] DINO term read against the teacher's entropy, measured per variant."""
    dino = [(v.name, v.dino_terms) for v in variants if v.dino_terms is not None]
    if not dino:
        return None
    ends = ", ".join(
        f"{name} {num(terms.final.loss_dino)} / {num(terms.final.teacher_entropy)}"
        for name, terms in dino
    )
    return (
        f"**The DINO loss** of `{dino[0][0]}` (first seed): "
        + dino_reading(dino[0][1])
        + f" Final [CLS] DINO loss / teacher entropy of every variant: {ends}."
    )


def _ln_separation(variants: list[VariantSummary]) -> str | None:
    """The [CLS]/patch cosine before and after LN1 of each variant that measured it."""
    ln = [(v.name, _mean(v, "cls_patch_pre_ln1"), _mean(v, "cls_patch_post_ln1")) for v in variants]
    ln = [(n, a, b) for n, a, b in ln if b is not None]
    if not ln:
        return None
    shown = ", ".join(f"{n} {num(a, 2)} → {num(b, 2)}" for n, a, b in ln)
    return (
        "**[CLS]/patch cosine before → after LN1** (mean over blocks): "
        f"{shown}. The paper reports ≈ 0 after LN1 in trained vanilla ViTs; values near the "
        "pre-LN1 level mean the blocks have not (yet) learned to separate the token types."
    )


def floors(results: ExperimentResults) -> list[str]:
    """Say when a probe sits at its trivial level, so no variant can be told apart by it."""
    out = []
    miou = [x for v in results.variants if (x := _mean(v, "seg_miou")) is not None]
    if len(miou) > 1 and max(miou) - min(miou) < 1e-3:
        out.append(
            f"**Segmentation is at its floor.** Every variant scores mIoU {num(miou[0])} (to "
            "0.001), the value of predicting one class (background) everywhere: at this scale "
            "the patch tokens carry no linearly readable shape class, so this metric, the "
            "paper's main one, cannot separate the variants here."
        )
    majority = results.majority_rate
    top1 = [
        x
        for v in results.variants
        for k in ("cls_top1", "patch_mean_top1")
        if (x := _mean(v, k)) is not None
    ]
    if majority is not None and top1:
        out.append(
            f"**Classification vs chance.** Top-1 ranges {num(min(top1))}–{num(max(top1))}; "
            f"always predicting the most frequent val class scores {num(majority)}"
            + (
                ": no variant beats it, so no class signal is readable here."
                if max(top1) <= majority
                else "."
            )
        )
    return out


def _style(v: VariantSummary) -> dict[str, Any]:
    colours = {"baseline": "C0", "norm_ls": "C1", "qkv": "C2", "gap": "C7", "finetune": "C4"}
    lines = {"none": "-", "registers": "--", "attn_bias": ":"}
    markers = {"none": "o", "registers": "s", "attn_bias": "^"}
    return {
        "color": colours[v.specialisation],
        "linestyle": lines[v.handling],
        "marker": markers[v.handling],
    }


def ln_figure(variants: list[VariantSummary]) -> Figure | None:
    from matplotlib.ticker import MaxNLocator

    with_ln = [v for v in variants if "cls_patch_post_ln1" in v.per_block]
    if not with_ln:
        return None
    fig = new_canvas(9.0, 3.6)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, key, title in (
        (axes[0], "cls_patch_pre_ln1", "before norm1"),
        (axes[1], "cls_patch_post_ln1", "after norm1"),
    ):
        for v in with_ln:
            vals = v.per_block.get(key, [])
            pts = [(b, x) for b, x in enumerate(vals) if x is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=v.name, ms=4, **_style(v))
        ax.axhline(0, color="0.7", lw=0.8)
        ax.set_title(f"[CLS]/patch cosine {title}", fontsize=9)
        ax.set_xlabel("block")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("mean cosine similarity")
    outside_legend(axes[1])
    caption = (
        "Mean cosine similarity between [CLS] and the patch tokens entering each block (left) "
        "and after that block's norm1 (right; the [CLS]-stream copy in specialised variants), "
        "averaged over the diagnosis images and the training seeds."
    )
    return figure("cls_patch_cosine_ln1", caption, fig)


def scatter_figure(variants: list[VariantSummary]) -> Figure | None:
    key = next(
        (
            k
            for k in ("seg_miou", "patch_mean_top1")
            if any(_mean(v, k) is not None for v in variants)
        ),
        None,
    )
    if key is None:
        return None
    fig = new_canvas(6.0, 4.0)
    ax = fig.subplots()
    for v in variants:
        x, y = _mean(v, "params_extra_pct"), _mean(v, key)
        if x is not None and y is not None:
            ax.plot(
                [x],
                [y],
                ls="none",
                ms=7,
                **{k: s for k, s in _style(v).items() if k != "linestyle"},
            )
            ax.annotate(v.name, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    label = "segmentation mIoU" if key == "seg_miou" else "mean-patch top-1"
    ax.set_xlabel("extra parameters over the shared model (%)")
    ax.set_ylabel(label)
    caption = (
        f"{label} (linear probe, val split) against the extra parameters of each variant "
        "(colour: specialisation; marker: none / registers / attention bias)."
    )
    return figure(f"{key}_vs_params", caption, fig)


def loss_figure(variants: list[VariantSummary]) -> Figure:
    fig = new_canvas(6.5, 3.6)
    ax = fig.subplots()
    for v in variants:
        curve = v.losses[0]
        ax.plot(
            range(1, len(curve) + 1),
            curve,
            label=v.name,
            lw=1,
            **{k: s for k, s in _style(v).items() if k != "marker"},
        )
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    outside_legend(ax)
    caption = "Training loss per step (first seed) of every variant."
    return figure("training_loss", caption, fig)


def report(doc: Envelope, figures: list[Figure]) -> Report:
    """The experiment's sections from its typed metrics.json document and the figures."""
    r: ExperimentResults = doc.results
    s = r.settings
    status = (
        f"complete: {r.n_done} variants"
        if r.complete
        else f"**partial: {r.n_done} of {r.n_total} variants done** (rerun the command to continue)"
    )
    summary = Section("summary", "Summary")
    setting = {k: text(getattr(s, k)) for k in SETTINGS}
    summary.blocks.append(
        f"{status}. Base: {setting['depth']} blocks, width {setting['embed_dim']}, "
        f"{setting['num_heads']} heads, patch {setting['patch_size']}, {setting['img_size']} px, "
        f"LayerScale init {setting['init_values']}; {setting['recipe']} recipe, "
        f"{setting['steps']} steps x {setting['batch_size']} images, lr {setting['lr']}, "
        f"{setting['seeds']} training seed(s). Probes: linear, last block, "
        f"{setting['probe_seeds']} probe seed(s), train split -> val split of "
        f"{code(r.data)}."
    )
    for task, why in r.skipped_tasks.items():
        summary.blocks.append(f"Probe **{task}** not run: {text(why)}.")
    t = r.timing
    summary.blocks.append(
        f"Time: {num(t.wall_s, 4)} s wall for this invocation; "
        f"{num(t.compute_s, 4)} s of training and evaluation summed over the variants "
        f"({text(t.reused)} reused from an earlier invocation)."
    )
    variants = r.variants
    table = Section("comparison", "Comparison", [comparison_table(variants)])
    table.blocks.append(
        "Means over training seeds (± sample std when there are several). Classification uses "
        "the [CLS] token or the mean patch token; segmentation a linear head on patch tokens "
        "(mIoU); depth a linear regression head on patch tokens (+[CLS]) (RMSE, metres). "
        "artifacts = the diagnose norms verdict; cos after LN1 averaged over blocks."
    )
    sections = [summary, table]
    d = deltas(variants)
    if d:
        sections.append(
            Section(
                "deltas",
                "Specialisation minus baseline (same high-norm handling)",
                [delta_table(d)],
            )
        )
    blocks = block_table(variants)
    if blocks is not None:
        sections.append(Section("ln1", "[CLS]/patch cosine after LN1, per block", [blocks]))
    said = [text(c) for c in r.conclusions] or ["–"]
    sections.append(Section("conclusions", "What can and cannot be concluded", said))
    if figures:
        sections.append(figure_section("Figures", figures))
    notes = [f"{code(v.name)}: {n}" for v in variants for n in v.notes]
    if notes:
        sections.append(Section("notes", "Notes", notes))
    sections.append(provenance_section(doc))
    return Report(None, "vitreg experiment: ViT variants", sections)


def write_report(
    out: Path,
    plan: ExperimentPlan,
    variants: list[VariantSummary],
    total: int,
    wall_s: float,
    command: str,
    splits: tuple[Any, Any],
    config: dict[str, JsonValue] | None = None,
) -> Envelope:
    """Write the comparison report of the variants done so far (all files atomically); the
    document's ``config`` (and config.yaml) is ``config``, by default the settings; the typed
    metrics.json document written (its ``results``: :class:`ExperimentResults`)."""
    s = plan.settings
    made = ExperimentResults(
        complete=len(variants) == total,
        n_done=len(variants),
        n_total=total,
        settings=s,
        data=plan.data,
        tasks=plan.tasks,
        skipped_tasks=plan.skipped_tasks,
        variants=variants,
        timing=Timing(
            wall_s=wall_s,
            compute_s=sum(v.time_s.train + v.time_s.evaluate for v in variants),
            reused=sum(v.reused for v in variants),
        ),
        majority_rate=plan.majority_rate,
        conclusions=[],
    )
    typed = made.model_copy(update={"conclusions": conclusions(made)})
    described = {
        "spec": f"vitreg.arch variants of a {s.depth}-block ViT (width {s.embed_dim})",
        "family": "vit",
        "source": "timm",
        "class": "VisionTransformer",
        "n_layers": s.depth,
        "d_model": s.embed_dim,
        "n_heads": s.num_heads,
        "image_size": [s.img_size, s.img_size],
        "weights": "trained",  # by this experiment, from scratch
        "notes": ["trained from scratch by this experiment; see results.variants for each one"],
    }
    train, val = splits
    data = {
        "description": plan.data,
        "n_images": len(train) + len(val),
        "train": train.describe(),
        "val": val.describe(),
    }
    doc = build_document(
        "experiment",
        typed.model_dump(mode="json"),
        headlines,
        command=command,
        described=model_info(ModelDescription.model_validate(described)),
        data=data_info(data),
        config=config or s.model_dump(mode="json", context=AS_GIVEN),
        typed=typed,
    )
    write_run(out, doc, report, lambda: experiment_figures(typed.variants))
    return doc


def experiment_figures(variants: list[VariantSummary]) -> list[Figure]:
    """[CLS]/patch cosine per block, score against extra parameters, and the training loss."""
    figures = [f for f in (ln_figure(variants), scatter_figure(variants)) if f is not None]
    return [*figures, loss_figure(variants)]
