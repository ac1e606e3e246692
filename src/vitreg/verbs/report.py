"""``vitreg report RUN``: render a run's report.md and report.html again from the results it
saved (metrics.json, or a comparison's comparison.json), as after a rendering failure. Figures
are those the run saved in figures/ (they are drawn from the analysis, which is not re-run),
and diagnose's block slider the maps it saved there (figures/slider.json): the pages are the
same bytes as the first rendering's."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from vitreg.core.run_dir import reopen, session
from vitreg.errors import InputError

# each verb's renderer: a module with headlines(results) and report(doc, figures)
RENDERERS = {
    "diagnose": "vitreg.report.verbs.diagnose",
    "neurons": "vitreg.report.verbs.neurons",
    "fix": "vitreg.report.verbs.fix",
    "probe": "vitreg.report.verbs.probe",
    "vlm": "vitreg.report.verbs.vlm",
    "train": "vitreg.report.verbs.train",
    "experiment": "vitreg.experiment.report",
}


def renderer(verb: str) -> ModuleType:
    """The renderer module of ``verb`` (imported when first needed)."""
    return importlib.import_module(RENDERERS[verb])


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
    from vitreg.report import writer
    from vitreg.report.compare import render_comparison_again

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
    render = renderer(doc["verb"]).report
    reopen(folder)  # issue 24: locked, and the files written listed in its manifest
    return writer.render_again(folder, lambda figures: (render(doc, figures), figures))
