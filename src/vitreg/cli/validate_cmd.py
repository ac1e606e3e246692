"""``vitreg validate RUN...``: each folder's verdict (the check is
:func:`vitreg.verbs.validate.run_validate`); a non-zero exit when any folder is invalid."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from vitreg.cli.output import console, fail


def show_run(run: Any, cfg: Any) -> None:
    """One line per folder, valid or invalid and why; fails when any is invalid."""
    for c in run.checked:
        if c.valid:
            console.print(f"[green]valid[/green] {escape(str(c.path))}: {c.text}")
        else:
            console.print(f"[red]invalid[/red] {escape(str(c.path))}: {escape(c.text)}")
    if run.invalid:
        raise fail(f"{run.invalid} of {len(run.checked)} run(s) failed validation")
