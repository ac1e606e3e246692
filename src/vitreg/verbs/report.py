"""``vitreg report RUN``: render a run's report.md and report.html again from the results it
saved (metrics.json, or a comparison's comparison.json), as after a rendering failure. Figures
are those the run saved in figures/ (they are drawn from the analysis, which is not re-run),
and diagnose's block slider the maps it saved there (figures/slider.json): the pages are the
same bytes as the first rendering's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitreg.core.run_dir import reopen, session
from vitreg.errors import InputError


def builders() -> dict[str, Any]:
    """Each verb's report from its document and figures (``train`` writes none)."""
    from vitreg.experiment.report import build_report as experiment_report
    from vitreg.report.fix_report import fix_report, neurons_report
    from vitreg.report.probe_report import probe_report
    from vitreg.report.verbs.diagnose import build_report
    from vitreg.report.vlm_report import vlm_report

    return {
        "diagnose": build_report,
        "neurons": neurons_report,
        "fix": fix_report,
        "probe": probe_report,
        "vlm": vlm_report,
        "experiment": experiment_report,
    }


def read_results(path: Path) -> dict[str, Any]:
    """The validated metrics.json at ``path``; InputError saying why it cannot be rendered."""
    from pydantic import ValidationError

    from vitreg.configs import describe_errors
    from vitreg.report.schema import validate_metrics

    try:
        doc = json.loads(path.read_text())
        return validate_metrics(doc).model_dump(mode="json")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path} cannot be read as JSON ({e})") from None
    except ValidationError as e:
        raise InputError(describe_errors(e, f"{path} does not follow the schema")) from None


@session()  # issue 24: the run reopened inside is released when rendering ends
def render_again(folder: str | Path) -> list[Path]:
    """Render the report of the run in ``folder`` again from its saved results; the files
    written. A failure (a bug) raises :class:`~vitreg.errors.RenderError`, results untouched."""
    from vitreg.report.compare import render_comparison_again
    from vitreg.report.run_files import (
        again_command,
        rendering,
        saved_figures,
        saved_slider,
        write_report,
    )

    folder = Path(folder)
    saved = folder / "metrics.json"
    if not saved.is_file():
        if (folder / "comparison.json").is_file():
            reopen(folder)  # issue 24: locked, and the files written listed in its manifest
            return render_comparison_again(folder)
        raise InputError(
            f"{folder} holds no metrics.json (nor comparison.json); pass a run directory "
            "written by vitreg"
        )
    doc = read_results(saved)
    build = builders().get(doc["verb"])
    if build is None:
        raise InputError(
            f"{folder} is a `vitreg {doc['verb']}` run, which writes no report: its "
            "metrics.json is the whole result"
        )
    reopen(folder)  # issue 24: locked, and the files written listed in its manifest
    with rendering(folder, saved, again_command(folder)):
        figures = saved_figures(folder)
        write_report(folder, build(doc, figures), figures, saved_slider(folder))
    return [folder / "report.md", folder / "report.html"]
