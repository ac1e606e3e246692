"""Run directory of ``vitreg export``: what was written (formats, shards, tokens per layer),
how each token is flagged and how many were dropped, and how fast; the activations themselves
are in the export's own files beside it (``index.json``, shards, tables, grids)."""

from __future__ import annotations

from pathlib import Path

from vitreg.report.document import Headline, build_document
from vitreg.report.render.envelope import (
    data_section,
    model_section,
    provenance_section,
    synthetic_banner,
)
from vitreg.report.render.markdown import Report, Section, Table, code, num, pct
from vitreg.report.render.plots import Figure
from vitreg.report.writer import write_run
from vitreg.results.export import ExportResults
from vitreg.results.schema import DataInfo, Envelope, ModelInfo
from vitreg.settings.base import ConfigFile

READING = (
    "Read the shards back with `vitreg.export.open(RUN)` (a torch `Dataset` of one layer's "
    "tokens with their labels; `.shards()` streams them for a `DataLoader`); `tokens/*.parquet` "
    "and `images/*.parquet` are one table each for pyarrow, pandas or polars; "
    "`patches.zarr` holds `[images, H, W, D]` per layer."
)


def headlines(results: ExportResults) -> list[Headline]:
    """Throughput and write rate."""
    return [
        Headline(
            "export.images_per_second", "/results/images_per_second", True, "images per second"
        ),
        Headline("export.write_mb_per_s", "/results/write_mb_per_s", True, "MB written per second"),
    ]


def report(doc: Envelope, figures: list[Figure]) -> Report:
    """The export's summary, per layer, then model, images and provenance."""
    r = doc.results
    assert isinstance(r, ExportResults)
    intro = Section(
        "summary",
        "Summary",
        [
            f"{r.n_images} images in {r.n_shards} shards of {r.shard_size}; site {code(r.site)}, "
            f"tokens {code(','.join(r.tokens))}, {r.dtype}, fix {code(r.fix)}; formats "
            f"{code(','.join(r.formats))}; {num(r.bytes_written / 2**20)} MiB written in "
            f"{num(r.seconds)} s ({num(r.images_per_second)} images/s, "
            f"{num(r.write_mb_per_s)} MB/s)"
            + (f"; {r.resumed_shards} shards kept from an earlier run" if r.resumed_shards else "")
            + ".",
            READING,
        ],
    )
    rows = [
        [
            layer.layer,
            code(layer.site),
            str(layer.rows),
            "none (no bimodal split)" if layer.outlier_cut is None else num(layer.outlier_cut),
            f"{layer.outliers} ({pct(layer.outlier_rate)})",
            num(layer.sink_events_per_image),
            ", ".join(f"{k}: {v}" for k, v in layer.excluded.items()) or "-",
        ]
        for layer in r.layers
    ]
    header = ["layer", "site", "rows", "outlier cut", "outlier patches", "sink events / image"]
    header.append("dropped")
    if any(layer.lof_tokens is not None for layer in r.layers):  # computed with --lof
        header.append("LOF anomaly tokens")
        for row, layer in zip(rows, r.layers, strict=True):
            row.append("-" if layer.lof_tokens is None else str(layer.lof_tokens))
    layers = Section("layers", "Layers", [Table(header, rows)])
    sections = [intro, layers, data_section(doc), model_section(doc), provenance_section(doc)]
    return Report(synthetic_banner(doc), "vitreg export: labelled activations", sections)


def write_export_run(
    out_dir: str | Path,
    results: ExportResults,
    described: ModelInfo,
    data: DataInfo,
    config: ConfigFile,
    command: str,
) -> Envelope:
    """config.yaml, metrics.json, report.md and report.html of one export; the document."""
    doc = build_document(
        "export",
        results.model_dump(mode="json"),
        headlines,
        command=command,
        described=described,
        data=data,
        config=config.to_file(),
        typed=results,
    )
    write_run(out_dir, doc, report)
    return doc
