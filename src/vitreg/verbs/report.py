"""``vitreg report RUN``: render a run's report.md and report.html again from the results it
saved (metrics.json, a comparison's comparison.json or a leaderboard's leaderboard.json), as
after a rendering failure. Figures
are those the run saved in figures/ (they are drawn from the analysis, which is not re-run),
and diagnose's block slider the maps it saved there (figures/slider.json): the pages are the
same bytes as the first rendering's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from vitreg.configs import ReportConfig
from vitreg.core.run_dir import reopen, session
from vitreg.core.verb import VERBS, Verb, register
from vitreg.errors import InputError
from vitreg.progress import SILENT, Progress
from vitreg.verbs.result import Listener, ReportRun


def renderer(verb: str) -> ModuleType:
    """The renderer module of ``verb`` (its record's, imported when first needed)."""
    return VERBS[verb].render_module()


def read_results(path: Path) -> Any:
    """The metrics.json at ``path`` as its verb's typed document (validated once, here; a 1.x
    file read as 2.0); InputError saying why it cannot be rendered."""
    from vitreg.core.readers import read_json
    from vitreg.report.documents import MAX_RUN_FILE
    from vitreg.results.schema import validate_metrics

    doc = read_json(path, "run file", max_bytes=MAX_RUN_FILE, allow_nan=True)
    return checked(lambda: validate_metrics(doc), path)


def checked(read: Callable[[], Any], path: Path) -> Any:
    """``read()``, a schema error in it an InputError naming ``path`` and the wrong fields."""
    from pydantic import ValidationError

    from vitreg.configs import describe_errors

    try:
        return read()
    except ValidationError as e:
        raise InputError(describe_errors(e, f"{path} does not follow the schema")) from None


@session()  # the run reopened inside is released when rendering ends
def render_again(folder: str | Path) -> list[Path]:
    """Render the report of the run in ``folder`` again from its saved results; the files
    written. A failure (a bug) raises :class:`~vitreg.errors.RenderError`, results untouched."""
    from vitreg.report import writer
    from vitreg.report.compare import render_comparison_again
    from vitreg.report.documents import RunDir, read_leaderboard
    from vitreg.report.renderers import leaderboard

    found = RunDir.open(folder)
    folder = found.path
    if found.kind == "comparison":
        reopen(folder)  # locked, and the files written listed in its manifest
        return render_comparison_again(folder)
    if found.kind == "leaderboard":
        board = checked(lambda: read_leaderboard(folder), found.document)  # typed, validated once
        reopen(folder)
        draw = lambda figures: (leaderboard.report(board, figures), figures)  # noqa: E731
        return writer.render_again(folder, draw, writer.BOARD)
    doc = read_results(found.document)
    render = renderer(doc.verb).report
    reopen(folder)
    return writer.render_again(folder, lambda figures: (render(doc, figures), figures))


def run_report(
    cfg: ReportConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> ReportRun:
    """``vitreg report RUN``: :func:`render_again` on ``cfg.run``."""
    return ReportRun(render_again(cfg.run))


VERB = register(
    Verb(
        config=ReportConfig,
        run=run_report,
        help="Render report.md and report.html again from a run's saved results (after a failure).",
        argument=("run",),
    )
)
