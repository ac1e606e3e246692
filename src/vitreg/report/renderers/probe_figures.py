"""Figures of a probe run: each metric per layer (base and fixed, 95% intervals, the yardsticks
as dashed lines) and, for segmentation, the predictions on a few test images."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vitreg.probe.scores import ProbeScores
from vitreg.probe.tasks import TaskResult
from vitreg.report.render.plots import Figure, display_images, figure, new_canvas
from vitreg.results.probe import ProbeResults

MAX_LINES = 8  # score lines per metric panel: the rest are in the tables


def _series(results: ProbeResults) -> dict[str, dict[tuple, list]]:
    """metric -> (condition, feature, group) -> [(layer index, mean, ci95)]."""
    out: dict[str, dict[tuple, list]] = {}
    for condition, layers in results.conditions.items():
        for li, layer in enumerate(layers):
            for s in layer.scores:
                if s.mean is None:
                    continue
                key = (condition, s.feature, s.group)
                out.setdefault(s.metric, {}).setdefault(key, []).append((li, s.mean, s.ci95 or 0.0))
    return out


def metric_per_layer(results: ProbeResults) -> Figure:
    """One panel per metric: every score across the probed layers with its 95% interval, base
    solid and fixed dashed, and the first layer's yardsticks as grey lines."""
    series = _series(results)
    layers = [str(x).removesuffix(".hook_resid_post") for x in results.layers]
    fig = new_canvas(7.5, 2.8 * max(1, len(series)))
    first = next(iter(results.conditions.values()))[0]
    for i, (metric, lines) in enumerate(series.items()):
        ax = fig.add_subplot(len(series), 1, i + 1)
        for (condition, feature, group), points in list(lines.items())[:MAX_LINES]:
            x, mean, ci = (np.array(v, dtype=float) for v in zip(*points, strict=True))
            label = f"{condition}: {feature}" + ("" if group == "all" else f" ({group})")
            ax.errorbar(
                x,
                mean,
                yerr=ci,
                capsize=3,
                marker="o",
                linestyle="-" if condition == "base" else "--",
                label=label,
            )
        for y in first.yardsticks:
            if y.metric == metric and y.value is not None and y.group == "all":
                ax.axhline(y.value, color="0.5", linestyle=":", linewidth=1)
                ax.annotate(y.name, (0, y.value), fontsize=7, color="0.4")
        ax.set_xticks(range(len(layers)), layers, fontsize=7, rotation=20)
        ax.set_ylabel(metric)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, borderaxespad=0)
    fig.subplots_adjust(left=0.1, right=0.62, bottom=0.12, top=0.95, hspace=0.6)
    styles = " (base solid, fixed dashed)" if len(results.conditions) == 2 else ""
    caption = (
        f"{results.task}: each score per probed block, mean over seeds with its 95% interval"
        f"{styles}; dotted grey lines: the yardsticks (trivial baselines)."
    )
    return figure("probe_per_layer", caption, fig)


def scores_at_layer(results: ProbeResults) -> Figure:
    """One probed layer: one panel per metric, a row per feature with each condition's mean and
    its 95% interval (base and fixed side by side), the yardsticks as dotted vertical lines."""
    series = _series(results)
    layer = str(results.layers[0]).removesuffix(".hook_resid_post")
    first = next(iter(results.conditions.values()))[0]
    conditions = list(results.conditions)
    rows = max(len({k[1:] for k in lines}) for lines in series.values())
    fig = new_canvas(7.5, (0.9 + 0.32 * rows * len(conditions)) * len(series))
    for i, (metric, lines) in enumerate(series.items()):
        ax = fig.add_subplot(len(series), 1, i + 1)
        features = list(dict.fromkeys(k[1:] for k in lines))
        step = 0.8 / len(conditions)
        for ci, condition in enumerate(conditions):
            ys, means, cis = [], [], []
            for fi, (feature, group) in enumerate(features):
                point = lines.get((condition, feature, group))
                if point:
                    ys.append(fi - 0.4 + step * (ci + 0.5))
                    means.append(point[0][1])
                    cis.append(point[0][2])
            ax.errorbar(means, ys, xerr=cis, fmt="o", capsize=3, label=condition)
        for y in first.yardsticks:
            if y.metric == metric and y.value is not None and y.group == "all":
                ax.axvline(y.value, color="0.5", linestyle=":", linewidth=1)
                ax.annotate(
                    y.name, (y.value, 0.98), xycoords=("data", "axes fraction"),
                    fontsize=7, color="0.4", rotation=90, va="top", ha="right",
                )  # fmt: skip
        names = [f + ("" if g == "all" else f" ({g})") for f, g in features]
        ax.set_yticks(range(len(features)), names, fontsize=8)
        ax.set_ylim(len(features) - 0.5, -0.5)
        ax.set_xlabel(metric)
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, borderaxespad=0)
    fig.subplots_adjust(left=0.28, right=0.82, bottom=0.1, top=0.95, hspace=0.6)
    caption = (
        f"{results.task} at `{layer}` (the one probed block): each feature's score, mean over "
        "seeds with its 95% interval, per condition; dotted grey lines: the yardsticks (trivial "
        "baselines)."
    )
    return figure("probe_scores", caption, fig)


def segmentation_examples(
    results: list[tuple[str, TaskResult]],
    images: dict[str, torch.Tensor | Sequence[float]],
    layer: str,
) -> Figure:
    """Rows = test images; columns = the image, its ground truth and each condition's
    prediction (first seed) at ``layer``; ignored pixels white."""
    from matplotlib.colors import ListedColormap

    target = results[0][1].examples["target"].numpy()
    k = int(results[0][1].info.num_classes or 0)
    shown = display_images(images.get("images"), images.get("mean"), images.get("std"))
    n = len(target)
    columns = ["image"] * (shown is not None) + ["ground truth", *(c for c, _ in results)]
    fig = new_canvas(1.9 * len(columns), 1.9 * n + 0.4)
    cmap = ListedColormap(_palette(k)).with_extremes(bad="white")
    for r in range(n):
        maps = [target[r]] + [res.examples["prediction"][r].numpy() for _, res in results]
        for c, title in enumerate(columns):
            ax = fig.add_subplot(n, len(columns), r * len(columns) + c + 1)
            ax.set_axis_off()
            if r == 0:
                ax.set_title(title, fontsize=9)
            if shown is not None and c == 0:
                ax.imshow(shown[r])
                continue
            m = maps[c - (shown is not None)].astype(float)
            m[m >= k] = np.nan  # the ignore label
            ax.imshow(m, cmap=cmap, vmin=-0.5, vmax=k - 0.5, interpolation="nearest")
    fig.subplots_adjust(left=0.02, right=0.98, bottom=0.02, top=0.92, wspace=0.05, hspace=0.08)
    caption = (
        f"Segmentation at `{layer}`: the first {n} test images as the model saw them, their "
        f"ground truth and each condition's prediction (first seed); {k} classes, one colour each."
    )
    return figure("probe_segmentation", caption, fig)


def _palette(k: int) -> list:
    from matplotlib import colormaps

    return [colormaps["tab20"](i % 20) for i in range(k)]


def pruning_curves(results: ProbeResults) -> Figure:
    """Token pruning: top-1 against the keep ratio, a curve per arm with its 95% interval (base
    solid, fixed dashed), all patches and the yardsticks as dotted lines."""
    from vitreg.probe.tasks.pruning import ALL, keep_group

    fig = new_canvas(7.5, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    for condition, layers in results.conditions.items():
        layer = layers[0]
        style = "-" if condition == "base" else "--"
        ratios = {keep_group(r): r for r in layer.info.keep_ratios or []}
        arms = dict.fromkeys(s.feature for s in layer.scores if s.feature != ALL)
        for ai, arm in enumerate(arms):
            points = sorted(
                (ratios[s.group], s.mean, s.ci95 or 0.0)
                for s in layer.scores
                if s.feature == arm and s.group in ratios and s.mean is not None
            )
            if points:
                x, mean, ci = (np.array(v, dtype=float) for v in zip(*points, strict=True))
                ax.errorbar(x, mean, yerr=ci, capsize=3, marker="o", color=f"C{ai}",
                            linestyle=style, label=f"{condition}: {arm}")  # fmt: skip
        full = next((s for s in layer.scores if s.feature == ALL and s.mean is not None), None)
        if full is not None:
            ax.axhline(full.mean, color="k", linestyle=style, linewidth=1)
            ax.annotate(f"{condition}: all patches", (0.0, full.mean), fontsize=7)
    first = next(iter(results.conditions.values()))[0]
    for y in first.yardsticks:
        if y.value is not None and y.group == "all":
            ax.axhline(y.value, color="0.5", linestyle=":", linewidth=1)
            ax.annotate(y.name, (0.0, y.value), fontsize=7, color="0.4")
    ax.set_xlabel("keep ratio (share of patch tokens kept)")
    ax.set_ylabel("top1")
    ax.set_xlim(0, 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, borderaxespad=0)
    fig.subplots_adjust(left=0.1, right=0.62, bottom=0.14, top=0.95)
    styles = " (base solid, fixed dashed)" if len(results.conditions) == 2 else ""
    caption = (
        "Token pruning: top-1 of a linear probe on the mean of the kept patches against the "
        f"share kept, one curve per ranking{styles}, mean over seeds with its 95% interval; "
        "black: all patches kept; dotted grey: the yardsticks."
    )
    return figure("probe_pruning_curves", caption, fig)


def probe_figures(run: ProbeScores) -> list[Figure]:
    """The figures of a probe run: its scores per layer (or at its one layer; for pruning the
    curves over the keep ratios) and, where its task kept example predictions, the last
    layer's predictions beside the targets."""
    results = run.results
    drawn = metric_per_layer if len(results.layers) > 1 else scores_at_layer
    if results.task == "pruning":
        drawn = pruning_curves
    figures = [drawn(results)] if _series(results) else []
    last = {
        c: rs[-1]
        for c, rs in results.conditions.items()
        if rs and isinstance(rs[-1], TaskResult) and rs[-1].examples
    }
    if last and run.images:
        layer = next(iter(last.values())).layer
        figures.append(segmentation_examples(list(last.items()), run.images, layer))
    return figures
