"""The validate verb: check folders vitreg wrote (runs, comparisons, leaderboards) against the
result-document schema: every results field typed, each headline traced to the number it
repeats, and the files that belong beside the document present."""

from __future__ import annotations

from pathlib import Path

from vitreg.configs import ValidateConfig
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.results.schema import Metric
from vitreg.verbs.result import Checked, Listener, ValidateRun

# files every verb's run directory holds beside metrics.json
COMPANIONS = ("config.yaml", "report.md", "report.html")
# files a comparison folder holds beside comparison.json (diagnose --models: also config.yaml)
COMPARISON_COMPANIONS = {
    "diagnose": ("config.yaml", "comparison.md", "report.html"),
    "compare": ("comparison.md", "report.html"),
}
BOARD_COMPANIONS = ("leaderboard.md", "report.html", "figures/fix_leaderboard.png")


def _companions(folder: Path, names: tuple[str, ...], beside: str) -> None:
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{folder} lacks {', '.join(missing)} beside its {beside}")


def check_comparison(folder: Path) -> str:
    """What a ``diagnose --models`` or ``compare --out`` folder holds; raises ValueError if its
    comparison.json, its files or (diagnose) any per-model run directory is invalid."""
    from vitreg.report.documents import comparison_members, read_comparison

    doc = read_comparison(folder)
    _companions(folder, COMPARISON_COMPANIONS[doc.verb], "comparison.json")
    if doc.verb == "compare":
        return f"compare output, {len(doc.runs)} runs, {len(doc.rows)} metric rows"
    bad = []
    for run in comparison_members(folder, doc):
        try:
            check_run(run, nested=True)
        except ValueError as e:
            bad.append(f"{run.name}: {e}")
    if bad:
        raise ValueError(
            f"{len(bad)} of its {len(doc.runs)} model runs are invalid: " + "; ".join(bad)
        )
    return f"diagnose --models comparison of {len(doc.runs)} valid model runs"


def check_board(folder: Path) -> str:
    """What a ``fix --method`` leaderboard folder holds; raises ValueError if its
    leaderboard.json does not follow the schema or a file is missing."""
    from pydantic import ValidationError

    from vitreg.configs import describe_errors
    from vitreg.report.documents import read_leaderboard

    try:
        doc = read_leaderboard(folder)
    except ValidationError as e:
        where = f"{folder / 'leaderboard.json'} does not follow the schema"
        raise ValueError(describe_errors(e, where)) from None
    _companions(folder, BOARD_COMPANIONS, "leaderboard.json")
    return f"fix leaderboard of {len(doc.board.rows)} entries on {doc.board.n_images} images"


def _traced_into_results(path: Path, metrics: list[Metric]) -> None:
    """Every headline's source points into ``results``: one pointing at itself (or anywhere
    else in the envelope) repeats no number of the results, so it traces nothing."""
    from vitreg.errors import brief

    for i, m in enumerate(metrics):
        if m.source != "/results" and not m.source.startswith("/results/"):
            raise ValueError(
                f"{path}: metrics[{i}] ({brief(m.name, 60)}) has the source "
                f"{brief(m.source, 80)}, which is not in results: a headline repeats a number "
                "of the results, so its source must point into /results"
            )


def check_run(run: Path, nested: bool = False) -> str:
    """What ``run`` (a run directory, its metrics.json, or a comparison or leaderboard folder
    vitreg wrote) holds; raises ValueError if invalid (an ``InputError`` for a file that is not
    even shaped like a run file)."""
    from pydantic import ValidationError

    from vitreg.configs import describe_errors
    from vitreg.errors import InputError
    from vitreg.report.documents import RunDir
    from vitreg.results.schema import validate_metrics

    try:
        folder = RunDir.open(run)
    except InputError as e:
        raise ValueError(str(e)) from None
    if folder.kind != "run" and nested:
        raise ValueError(f"{run} has no metrics.json (a model run of a comparison holds one)")
    if folder.kind == "comparison":
        return check_comparison(folder.path)
    if folder.kind == "leaderboard":
        return check_board(folder.path)
    path = folder.document
    if not path.is_file():
        raise ValueError(f"{run} has no metrics.json (not a folder vitreg wrote)")
    doc = folder.metrics()
    try:
        valid = validate_metrics(doc.read)
    except ValidationError as e:
        raise ValueError(describe_errors(e, f"{path} does not follow the schema")) from None
    _traced_into_results(path, valid.metrics)
    _companions(path.parent, COMPANIONS, "metrics.json")
    version = doc.read.get("schema_version")
    read = "" if version == valid.schema_version else f" (read as {valid.schema_version})"
    return f"{valid.verb} run, schema {version}{read}, {len(valid.metrics)} headline metrics"


def run_validate(
    cfg: ValidateConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> ValidateRun:
    """Check every folder of ``cfg.runs``; a folder that fails is reported, not raised."""
    checked = []
    for run in cfg.runs:
        try:
            checked.append(Checked(run, True, check_run(run)))
        except ValueError as e:
            checked.append(Checked(run, False, str(e)))
    return ValidateRun(checked)


VERB = register(
    Verb(
        config=ValidateConfig,
        run=run_validate,
        help="Check folders vitreg wrote: schema, per-verb results, headlines traced to "
        "results, files.",
        argument=("runs",),
    )
)
