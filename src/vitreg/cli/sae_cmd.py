"""``vitreg experiment sae``: the three arms' headline measures and where the report is (the run
is :func:`vitreg.verbs.experiment_sae.run_sae`)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from vitreg.cli.output import console, show_path


def show_run(run: Any, cfg: Any) -> None:
    """Each arm's error on ordinary patches and outlier latents, then the report's path."""
    for line in run.lines:
        console.print(escape(line))
    show_path("report", run.run_dir / "report.md", " (metrics.json, report.html, figures/)")
