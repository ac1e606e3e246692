"""``vitreg experiment sae``: the three arms' headline measures and where the report is (the run
is :func:`vitreg.verbs.experiment_sae.run_sae`)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from vitreg.cli.output import console, show_path


def show_run(run: Any, cfg: Any) -> None:
    """Each arm's error on ordinary patches and outlier latents, then the report's path."""
    from vitreg.report.renderers.sae import LABELS, shown

    r = run.results
    if r is not None:
        for arm in r.arms:
            parts = [
                f"{LABELS[m][0]} {shown(getattr(arm, m), LABELS[m][1])}"
                for m in ("ordinary_error", "outlier_latents", "outlier_loss_share")
                if getattr(arm, m) is not None
            ]
            console.print(escape(f"{arm.name}: " + "; ".join(parts)))
    show_path("report", run.run_dir / "report.md", " (metrics.json, report.html, figures/)")
