"""Run directories for ``vitreg diagnose``: config.yaml, metrics.json, figures/, report.md/.html.

Every file is written atomically, config.yaml and metrics.json first: a crash never leaves a
half-written metrics.json, and a failure while rendering (a bug) leaves the results saved and
raises :class:`~vitreg.errors.RenderError`, which names ``vitreg report RUN`` to render again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vitreg.report.markdown import Table, markdown_table, num, pct
from vitreg.report.run_files import (
    again_command,
    rendering,
    save_document,
    save_figures,
    save_slider,
    write_report,
)
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
from vitreg.report.verbs.diagnose import build_report


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
    from vitreg.report.figures import display_images, figure_formats, figures_for
    from vitreg.report.html import slider_data

    out = Path(out_dir)
    doc = build_document(result, config, command)
    saved = save_document(out, doc)
    with rendering(out, saved, again_command(out)):
        shown = display_images(images[:max_maps] if images is not None else None, mean, std)
        figs = figures_for(result, shown)
        save_figures(out, figs, figure_formats(config))
        slider = slider_data(result, shown)
        save_slider(out, slider)
        write_report(out, build_report(doc, figs), figs, slider)
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
    rows = model_rows(results)
    return rows_table(rows), rows


def model_rows(results: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """One row of headline numbers per model, from diagnose results labelled by model."""
    rows = []
    for label, result in results:
        metrics = {m["name"]: m for m in headline_metrics(plain(result.to_dict()))}
        row: dict[str, Any] = {"model": label}
        for key, _ in COMPARE_COLUMNS:
            row[key] = metrics[key]["value"] if key in metrics else None
        peak = metrics.get("norm_ratio.max_over_median.peak") or {}
        row["max_over_median_layer"] = peak.get("layer")
        row["verdict"] = "artifacts" if metrics["artifacts_present"]["value"] else "no artifacts"
        rows.append(row)
    return rows


def rows_table(rows: list[dict[str, Any]]) -> Table:
    """The cross-model table of :func:`model_rows` (as comparison.json keeps them)."""
    return Table(
        ["model", *(title for _, title in COMPARE_COLUMNS), "verdict"],
        [
            [
                f"`{r['model']}`",
                pct(r["outlier_rate"]),
                num(r["emergence_layer"]),
                f"{num(r['norm_ratio.max_over_median.peak'])} "
                f"(layer {num(r['max_over_median_layer'])})",
                num(r["attention_norm_iou"]),
                r["verdict"],
            ]
            for r in rows
        ],
    )
