"""The models verb: the supported model families, example specs and what to watch out for."""

from __future__ import annotations

from vitreg.configs import ModelsConfig
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.verbs.result import Listener, ModelsRun


def run_models(
    cfg: ModelsConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> ModelsRun:
    """One row per family: its description and whether its library is installed."""
    from vitreg.models.families import families, status

    return ModelsRun([{**fam.to_dict(), "status": status(fam)} for fam in families()])


VERB = register(
    Verb(
        config=ModelsConfig,
        run=run_models,
        help="List the supported model families with example specs and what to watch out for.",
        flags={"as_json": "--json"},
    )
)
