"""``vitreg validate RUN...``: check run directories against the result-document schema."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from vitreg.cli.output import console, fail

# files every verb's run directory holds beside metrics.json (train writes no report)
COMPANIONS = {"train": ("config.yaml",)}
DEFAULT_COMPANIONS = ("config.yaml", "report.md", "report.html")


def check_run(run: Path) -> str:
    """What ``run`` (a run directory or its metrics.json) holds; raises ValueError if invalid."""
    from pydantic import ValidationError

    from vitreg.configs import describe_errors
    from vitreg.report.schema import validate_metrics

    path = run / "metrics.json" if run.is_dir() else run
    if not path.is_file():
        raise ValueError(f"{run} has no metrics.json (not a vitreg run directory)")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path} holds a JSON {type(doc).__name__}, not a result document")
    try:
        valid = validate_metrics(doc)
    except ValidationError as e:
        raise ValueError(describe_errors(e, f"{path} does not follow the schema")) from None
    missing = [
        name
        for name in COMPANIONS.get(valid.verb, DEFAULT_COMPANIONS)
        if not (path.parent / name).is_file()
    ]
    if missing:
        raise ValueError(f"{path.parent} lacks {', '.join(missing)} beside its metrics.json")
    return f"{valid.verb} run, schema {valid.schema_version}, {len(valid.metrics)} headline metrics"


def validate_command(
    runs: list[Path] = typer.Argument(..., help="Run directories (or their metrics.json)."),
) -> None:
    """Check run directories: schema, per-verb results, headlines traced to results, files."""
    bad = 0
    for run in runs:
        try:
            what = check_run(run)
        except ValueError as e:
            bad += 1
            console.print(f"[red]invalid[/red] {escape(str(run))}: {escape(str(e))}")
        else:
            console.print(f"[green]valid[/green] {escape(str(run))}: {what}")
    if bad:
        raise fail(f"{bad} of {len(runs)} run(s) failed validation")
