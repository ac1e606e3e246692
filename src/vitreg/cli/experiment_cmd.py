"""``vitreg experiment variants --data D``: the summary of the variant grid's run (the run is
:func:`vitreg.verbs.run_experiment`)."""

from __future__ import annotations

from typing import Any

from vitreg.cli.output import show_path


def show_run(run: Any, cfg: Any) -> None:
    """How many variants ran, how long it took, and where the report is."""
    show_path(
        f"{len(run.experiment.results.variants)} variants in {run.seconds:.0f} s; report",
        run.run_dir / "report.md",
        " (metrics.json, report.html, figures/)",
    )
