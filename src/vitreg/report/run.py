"""Run directories for ``vitreg diagnose``: config.yaml, report.md/.html, figures/, metrics.json.

Every file is written atomically and metrics.json last (after a stale one is removed first),
so a crash never leaves a half-written metrics.json, nor a metrics.json without its report.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vitreg.core.io import write_json_atomic, write_text_atomic
from vitreg.report.markdown import Table, build_report, markdown_table, num, pct, render_markdown
from vitreg.report.schema import (
    SCHEMA_VERSION,
    data_info,
    headline_metrics,
    model_info,
    plain,
    utc_now,
    validate_metrics,
    versions,
)


def build_document(result: Any, config: dict[str, Any], command: str) -> dict[str, Any]:
    """The validated metrics.json document of a :class:`DiagnoseResult`."""
    results = plain(result.to_dict())
    doc = {
        "schema_version": SCHEMA_VERSION,
        "verb": "diagnose",
        **versions(),
        "created": utc_now(),
        "command": command,
        "model": model_info(result.model),
        "data": data_info(result.data),
        "config": plain(config),
        "results": results,
        "metrics": headline_metrics(results),
    }
    return validate_metrics(doc).model_dump(mode="json")


def write_run(
    out_dir: str | Path,
    result: Any,
    *,
    images: torch.Tensor | None = None,
    config: dict[str, Any],
    command: str,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    max_maps: int = 8,
) -> Path:
    """Write the run directory for ``result``; ``images`` (model input space) feed the overlays.

    ``mean``/``std`` (the model's data config) de-normalise ``images`` for display; without
    them images are taken as [0, 1] (or rescaled per image when outside that range).
    """
    import yaml

    from vitreg.report.figures import display_images, figure_formats, figures_for
    from vitreg.report.html import render_html, slider_data

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").unlink(missing_ok=True)
    doc = build_document(result, config, command)
    shown = display_images(images[:max_maps] if images is not None else None, mean, std)
    figs = figures_for(result, shown)
    for fig in figs:
        fig.save(out / "figures", figure_formats(config))
    report = build_report(doc, figs)
    write_text_atomic(out / "config.yaml", yaml.safe_dump(doc["config"], sort_keys=False))
    write_text_atomic(out / "report.md", render_markdown(report))
    write_text_atomic(out / "report.html", render_html(report, figs, slider_data(result, shown)))
    write_json_atomic(out / "metrics.json", doc)
    return out


COMPARE_COLUMNS = (
    ("outlier_rate", "outlier rate"),
    ("emergence_layer", "emergence layer"),
    ("norm_ratio.max_over_median.peak", "max/median norm"),
    ("attention_norm_iou", "attention-norm IoU"),
)


def compare_table(results: list[tuple[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The cross-model table (Markdown and rows): outlier rate, emergence, norm ratio, agreement, verdict."""
    table, rows = model_table(results)
    return markdown_table(table), rows


def model_table(results: list[tuple[str, Any]]) -> tuple[Table, list[dict[str, Any]]]:
    """The cross-model table and its rows, from diagnose results labelled by model."""
    rows = []
    for label, result in results:
        metrics = {m["name"]: m for m in headline_metrics(plain(result.to_dict()))}
        row: dict[str, Any] = {"model": label}
        for key, _ in COMPARE_COLUMNS:
            row[key] = metrics[key]["value"] if key in metrics else None
        row["max_over_median_layer"] = metrics["norm_ratio.max_over_median.peak"]["layer"]
        row["verdict"] = "artifacts" if metrics["artifacts_present"]["value"] else "no artifacts"
        rows.append(row)
    table = Table(
        ["model", *(title for _, title in COMPARE_COLUMNS), "verdict"],
        [
            [
                f"`{r['model']}`",
                pct(r["outlier_rate"]),
                num(r["emergence_layer"]),
                f"{num(r['norm_ratio.max_over_median.peak'])} (layer {r['max_over_median_layer']})",
                num(r["attention_norm_iou"]),
                r["verdict"],
            ]
            for r in rows
        ],
    )
    return table, rows
