"""``vitreg report RUN``: the files rendered again (the rendering is
:func:`vitreg.verbs.report.render_again`)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from vitreg.cli.output import console


def show_run(run: Any, cfg: Any) -> None:
    """Each file written."""
    for path in run.written:
        console.print(f"written: [bold]{escape(str(path))}[/bold]")
