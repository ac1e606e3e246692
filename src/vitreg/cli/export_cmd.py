"""``vitreg export SPEC --images DIR --out DIR``: labelled activations for other tools."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from vitreg.cli.output import console, show_path


def show_run(run: Any, cfg: Any) -> None:
    """Per layer: rows written, outliers flagged, dropped tokens; then the folder."""
    from vitreg.verbs.display import num

    r = run.results
    table = Table(title=f"vitreg export: {r.n_images} images, {r.n_shards} shards")
    for column in ("layer", "site", "rows", "outlier patches", "sink events / image", "dropped"):
        table.add_column(column)
    for layer in r.layers:
        dropped = ", ".join(f"{k}: {v}" for k, v in layer.excluded.items()) or "-"
        table.add_row(
            layer.layer,
            layer.site,
            str(layer.rows),
            str(layer.outliers),
            num(layer.sink_events_per_image),
            dropped,
        )
    console.print(table)
    console.print(
        f"{num(r.images_per_second)} images/s, {num(r.write_mb_per_s)} MB/s written"
        + (f"; {r.resumed_shards} shards kept from an earlier run" if r.resumed_shards else "")
    )
    show_path("export (read with vitreg.export.open)", run.run_dir)
