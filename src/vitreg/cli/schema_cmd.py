"""``vitreg schema``: print (or write) the JSON Schema of metrics.json, for readers of runs in
other languages."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from vitreg.cli.output import cli_errors, console


def schema_command(
    out: Path | None = typer.Option(
        None, "--out", help="Write the schema to this file instead of printing it."
    ),
) -> None:
    """Export the JSON Schema of metrics.json (every verb's results, every field typed)."""
    from vitreg.core.io import write_text_atomic
    from vitreg.results.schema import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    with cli_errors():
        write_text_atomic(out, text)
    console.print(f"written: [bold]{escape(str(out))}[/bold]")
