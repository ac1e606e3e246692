"""``vitreg report RUN``: render a run's report again from its saved results (the run is
:func:`vitreg.verbs.report.render_again`; this module prints what it wrote)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from vitreg.cli.output import cli_errors, console


def report_command(
    run: Path = typer.Argument(
        ..., help="A folder vitreg wrote (a run, a comparison or a fix leaderboard)."
    ),
) -> None:
    """Render report.md and report.html again from a run's saved results (after a failure)."""
    from vitreg.verbs.report import render_again

    with cli_errors():
        written = render_again(run)
    for path in written:
        console.print(f"written: [bold]{escape(str(path))}[/bold]")
