"""``vitreg compare RUN...``: the headline metrics of several runs as one table on the console
(the merge is :func:`vitreg.verbs.compare.run_compare`)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from vitreg.cli.output import console, show_path


def show_run(run: Any, cfg: Any) -> None:
    """The folders skipped and why, then one row per run and metric."""
    from vitreg.verbs.display import num

    for path, why in run.merged.skipped.items():
        console.print(f"[yellow]skipped {escape(path)}: {escape(why)}[/yellow]")
    for note in run.merged.notes or []:
        console.print(f"[yellow]note: {escape(note)}[/yellow]")
    table = Table(title="vitreg compare")
    table.add_column("run", overflow="fold", max_width=28)
    table.add_column("metric", overflow="fold")
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("direction", no_wrap=True)
    previous = None
    for row in run.rows:
        name = "" if row.run == previous else row.run
        if name and previous is not None:
            table.add_section()
        previous = row.run
        table.add_row(escape(name), escape(row.metric), num(row.value, 4), row.direction)
    console.print(table)
    if run.out is not None:
        show_path("written", run.out, " (comparison.md, report.html, comparison.json)")
