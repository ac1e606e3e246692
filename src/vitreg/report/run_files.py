"""Run-directory files shared by the verbs that write them (neurons, fix, probe): the metrics.json
document with traceable headlines, the synthetic-model banner, and the write order (figures,
report.md, report.html, config.yaml, then metrics.json last, a stale one removed first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitreg.core.io import write_json_atomic, write_text_atomic
from vitreg.report.figures import Figure, figure_formats
from vitreg.report.markdown import (
    FigureRef,
    Report,
    Section,
    is_random_init,
    random_init_banner,
    render_markdown,
)
from vitreg.report.schema import (
    SCHEMA_VERSION,
    Metric,
    data_info,
    is_synthetic,
    model_info,
    plain,
    resolve,
    utc_now,
    validate_metrics,
    versions,
)


def document(
    verb: str,
    command: str,
    described: dict[str, Any],
    data: dict[str, Any],
    config: dict[str, Any],
    results: dict[str, Any],
    headlines: list[tuple],
) -> dict[str, Any]:
    """The validated metrics.json document of one ``verb`` run; ``headlines`` are ``(name,
    pointer, higher_is_better, extra)`` with a JSON pointer into the document."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "verb": verb,
        **versions(),
        "created": utc_now(),
        "command": command,
        "model": model_info(described),
        "data": data_info(data),
        "config": plain(config),
        "results": plain(results),
    }
    doc["metrics"] = [
        Metric(
            name=name, value=resolve(doc, pointer), higher_is_better=better, source=pointer, **extra
        ).model_dump(mode="json")
        for name, pointer, better, extra in headlines
    ]
    return validate_metrics(doc).model_dump(mode="json")


def write_files(
    out: Path, doc: dict[str, Any], report: Report | None, figures: list[Figure]
) -> Path:
    """Figures, report.md, report.html (with a report) and config.yaml first, metrics.json last
    (a stale one removed first): the one writer of every verb's run directory."""
    import yaml

    from vitreg.report.html import render_html

    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").unlink(missing_ok=True)
    for fig in figures:
        fig.save(out / "figures", figure_formats(doc["config"]))
    write_text_atomic(out / "config.yaml", yaml.safe_dump(doc["config"], sort_keys=False))
    if report is not None:
        write_text_atomic(out / "report.md", render_markdown(report))
        write_text_atomic(out / "report.html", render_html(report, figures, None))
    write_json_atomic(out / "metrics.json", doc)
    return out


def synthetic_banner(doc: dict[str, Any]) -> str | None:
    """The banner of a report on a model that is not a trained ViT: a synthetic (planted) one,
    or one built with ``--random-init``; ``None`` for trained weights."""
    model = doc["model"]
    if not is_synthetic(model):
        return random_init_banner(model.get("spec") or "model") if is_random_init(doc) else None
    return (
        f"**SYNTHETIC MODEL:** `{model.get('spec')}` has random weights with planted register "
        "neurons; it is not a trained ViT. Use this report to check the tool, not to draw "
        "conclusions about real models."
    )


def figure_section(title: str, figures: list[Figure]) -> Section:
    return Section(
        "figures", title, [FigureRef(f"figures/{f.filename}", f.caption) for f in figures]
    )
