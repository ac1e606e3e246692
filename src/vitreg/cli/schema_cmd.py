"""``vitreg schema``: print the JSON Schema of metrics.json, or say where it was written."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape

from vitreg.cli.output import console


def show_run(run: Any, cfg: Any) -> None:
    """The schema on stdout, or the file it was written to."""
    if run.out is None:
        typer.echo(run.text, nl=False)
    else:
        console.print(f"written: [bold]{escape(str(run.out))}[/bold]")
