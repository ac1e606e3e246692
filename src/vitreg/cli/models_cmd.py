"""``vitreg models``: the supported model families, example specs and what to watch out for."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from vitreg.cli.output import console


def show_run(run: Any, cfg: Any) -> None:
    """The families as a table, then each one's example specs and notes (or JSON)."""
    rows = run.rows
    if cfg.as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="vitreg model families")
    for column in ("family", "name", "library", "adapter", "status"):
        table.add_column(column, style="bold" if column == "family" else None)
    for row in rows:
        colour = "green" if row["status"] == "ready" else "yellow"
        status_cell = f"[{colour}]{escape(row['status'])}[/{colour}]"
        table.add_row(row["key"], escape(row["name"]), row["library"], row["adapter"], status_cell)
    console.print(table)
    for row in rows:
        console.print(f"\n[bold]{row['key']}[/bold]: {escape(row['name'])}")
        for spec in row["examples"]:
            console.print(f"  [cyan]{spec}[/cyan]")
        for note in row["notes"]:
            console.print(Padding(Text(f"- {note}"), (0, 0, 0, 2)))
    console.print("\nLoad a spec with vitreg.load(SPEC); `vitreg inspect SPEC` describes it.")
