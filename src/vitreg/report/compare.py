"""Comparisons of several runs: ``vitreg compare RUN...`` and ``vitreg diagnose --models``.

Both write the same files to one folder: comparison.json (the rows) first, then figures/,
comparison.md and report.html (the wide table, one column per run, and per-model curves of
diagnose runs), which ``vitreg report FOLDER`` renders again from comparison.json. The console
shows the long format (run, metric, value, direction), which fits 100 columns however many runs
there are. Folders that are not runs are skipped with a note.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue, ValidationError

from vitreg.core.intervals import interval_verdict
from vitreg.errors import InputError
from vitreg.report.compare_notes import not_finite, schema_notes, value_note
from vitreg.report.documents import RunDir, comparison_members, read_comparison
from vitreg.report.render.markdown import (
    FigureRef,
    Report,
    Section,
    Table,
    code,
    escape_text,
    finite,
    num,
)
from vitreg.report.render.plots import Figure, figure, new_canvas, outside_legend
from vitreg.report.renderers.diagnose import model_rows, rows_table
from vitreg.report.writer import COMPARE, MODELS, Layout, render_again, write_run
from vitreg.results.comparison import (
    DIRECTION,  # noqa: F401  (importable from here too)
    Comparison,
    ComparisonRow,
    LongRow,
    ModelComparison,
)
from vitreg.results.diagnose import DiagnoseResults, SiteNorms
from vitreg.results.schema import Headline, RunDocument, resolve, validate_metrics
from vitreg.results.upgrade import upgrade

if TYPE_CHECKING:
    from vitreg.analysis.diagnose import DiagnoseResult

Draw = Callable[[], tuple[Report, list[Figure]]]  # a comparison's report and its figures
CURVE_RULE = "auto"  # the outlier rule of the verdict; its rate per layer is what the curves show


def labels(runs: list[Path]) -> list[str]:
    """Column labels: the run folder names, made unique with their parents when they clash."""
    names = [r.name if r.is_dir() else r.parent.name for r in runs]
    if len(set(names)) == len(names):
        return names
    return [str(r) for r in runs]


def load_runs(paths: Sequence[Path]) -> tuple[list[tuple[Path, RunDocument]], dict[str, str]]:
    """The runs among ``paths`` with their documents, each read through :class:`RunDir`, and
    each skipped path with the reason. A comparison folder (``diagnose --models``,
    ``compare --out``) stands for the runs it lists."""
    runs, skipped = [], {}
    for p in map(Path, paths):
        try:
            found = RunDir.open(p)
            members = (
                comparison_members(found.path, read_comparison(found.path))
                if found.kind == "comparison"
                else [p]
            )
        except InputError as e:
            skipped[str(p)] = str(e).removeprefix(f"{p} ")
            continue
        for run in members:
            if any(run.resolve() == seen.resolve() for seen, _ in runs):
                continue  # listed twice (e.g. a comparison folder and one of its runs)
            try:
                runs.append((run, RunDir.open(run).metrics()))
            except InputError as e:
                skipped[str(run)] = str(e).removeprefix(f"{run} ")
    return runs, skipped


def row_key(doc: RunDocument, name: str) -> tuple[str, str, str | None]:
    """What a metric of ``doc`` is, so that only like is compared with like: the verb, the name
    (a probe score's name starting with its task and data, as written since 1.1), and the data
    of a run whose names do not say it (a diagnose on other images is another row)."""
    from vitreg.report.renderers.probe import task_and_data

    verb = str(doc.verb or "diagnose")
    if verb == "probe":
        prefix = task_and_data(doc.results or {})
        return verb, name if name.startswith(f"{prefix}/") else f"{prefix}/{name}", None
    data = (doc.data or {}).get("description")
    return verb, name, None if data is None else str(data)


def interval(doc: RunDocument, metric: Headline) -> float | None:
    """The 95% half-width a run keeps beside a headline number (probe scores: ``ci95`` next to
    ``mean``), or None when it has none."""
    source = metric.source or ""
    if metric.aggregate or not source.endswith("/mean"):
        return None
    try:
        ci = resolve(doc.read, source.removesuffix("/mean") + "/ci95")
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return float(ci) if isinstance(ci, (int, float)) and not isinstance(ci, bool) else None


def verdicts(row: ComparisonRow) -> list[str | None]:
    """Each run against the first: better/worse only when the 95% intervals separate, "within
    noise" when they overlap, "no interval" when only one side has one; None for the first run,
    a missing value, a metric without a direction or numbers that carry no interval at all."""
    cis = row.ci95 or [None] * len(row.values)
    first, ci0 = row.values[0], cis[0]
    if first is None or row.higher_is_better is None:
        return [None] * len(row.values)
    return [None] + [
        None
        if v is None or (ci is None and ci0 is None)
        else interval_verdict((first, ci0), (v, ci), row.higher_is_better)
        for v, ci in zip(row.values[1:], cis[1:], strict=True)
    ]


def compare_runs(runs: Sequence[Path], contains: str | None = None) -> Comparison:
    """One row per headline metric (in first-seen order), one value per run (None if absent),
    its 95% half-width where the run has one, and each run's verdict against the first run;
    ``skipped`` names each path that is not a run and why; the runs' documents kept beside."""
    if not runs:
        raise InputError("compare needs at least one run directory")
    found, skipped = load_runs(runs)
    if not found:
        raise InputError(
            f"none of the {len(skipped)} paths is a run directory with a metrics.json: "
            + "; ".join(f"{p}: {why}" for p, why in skipped.items())
        )
    notes: list[str] = []
    for run, doc in found:
        try:
            validate_metrics(doc.read)
        except ValueError as e:  # a pydantic ValidationError too
            notes += schema_notes(run, e)
    rows = _rows(found, contains, notes)
    sources = [
        {"run": str(r), "path": str(r.resolve()), "verb": d.verb, "command": d.command}
        | {"model": d.spec}
        for r, d in found
    ]
    merged = Comparison.model_validate(
        {
            "runs": labels([r for r, _ in found]),
            "sources": sources,
            "rows": rows,
            "skipped": skipped,
            **({"notes": notes} if notes else {}),
        }
    )
    return merged.with_documents([d for _, d in found])


def _rows(
    found: list[tuple[Path, RunDocument]], contains: str | None, notes: list[str]
) -> list[ComparisonRow]:
    """The rows of :func:`compare_runs`, each with its verdicts; a value that is not a finite
    number is a note (in ``notes``) and no value."""
    order: dict[tuple[str, str, str | None], bool | None] = {}
    values: list[dict[tuple[str, str, str | None], bool | int | float | None]] = []
    intervals: list[dict[tuple[str, str, str | None], float | None]] = []
    for run, doc in found:
        here, cis = {}, {}
        for m in doc.metrics:
            key = row_key(doc, m.name)
            if contains is None or contains in key[1]:
                order.setdefault(key, m.higher_is_better)
                here[key] = m.value
                cis[key] = interval(doc, m)
                if not_finite(here[key]):
                    notes.append(value_note(run, m.name, here[key]))
                    here[key] = None
        values.append(here)
        intervals.append(cis)
    verbs = {key[0] for key in order}
    data: dict[str, set[str | None]] = {}  # the data descriptions of each verb's runs
    for verb, _, described in order:
        data.setdefault(verb, set()).add(described)
    rows = [
        ComparisonRow(
            metric=key[1]
            + (f" ({key[0]})" if len(verbs) > 1 else "")
            + (f" on {key[2]}" if len(data[key[0]]) > 1 and key[2] is not None else ""),
            verb=key[0],
            higher_is_better=better,
            values=[v.get(key) for v in values],
            ci95=[c.get(key) for c in intervals],
        )
        for key, better in order.items()
    ]
    for row in rows:
        row.vs_first = verdicts(row)
    return rows


def long_rows(merged: Comparison) -> list[LongRow]:
    """The long format: one row per (run, metric) that has a value, runs in order."""
    return merged.long_rows()


def _cell(value: bool | int | float | None, ci: float | None, verdict: str | None) -> str:
    text = num(value) + (f" ± {num(ci)}" if value is not None and ci is not None else "")
    return text + (f" ({verdict} vs the first run)" if verdict else "")


def wide_table(merged: Comparison) -> Table:
    """One row per metric, one column per run (arrow: which way is better): each value with its
    95% interval where the run has one, and its verdict against the first run (better/worse
    only when the intervals separate)."""
    rows = []
    for r in merged.rows:
        cis = r.ci95 or [None] * len(r.values)
        marks = r.vs_first or [None] * len(r.values)
        rows.append(
            [
                code(r.metric) + {True: " ↑", False: " ↓"}.get(r.higher_is_better, ""),
                *(_cell(v, c, m) for v, c, m in zip(r.values, cis, marks, strict=True)),
            ]
        )
    return Table(["metric", *merged.runs], rows)


def layer_curves(labelled: Sequence[tuple[str, RunDocument | None]]) -> Figure | None:
    """Per-layer outlier rate and max/median patch norm of every diagnose run, one colour per
    model, on one figure (None when no run has per-layer norms; a run that is gone: None)."""
    curves = [(label, layers) for label, doc in labelled if (layers := norm_layers(doc))]
    if not curves:
        return None
    fig = new_canvas(7.0, 4.8)
    rate_ax, ratio_ax = fig.subplots(2, 1, sharex=True)
    for i, (label, layers) in enumerate(curves):
        x = [lo.layer for lo in layers]
        rates = [100 * (lo.outlier_rate.get(CURVE_RULE) or 0.0) for lo in layers]
        ratios = [lo.max_over_median for lo in layers]
        colour = f"C{i % 10}"
        rate_ax.plot(x, rates, marker=".", color=colour, label=label)
        ratio_ax.plot(x, [r if finite(r) else math.nan for r in ratios], marker=".", color=colour)
    rate_ax.set_ylabel(f"outlier rate ({CURVE_RULE}, %)")
    ratio_ax.set_ylabel("max / median patch norm")
    ratio_ax.set_yscale("log")
    ratio_ax.set_xlabel("block")
    outside_legend(rate_ax)
    caption = (
        "Per block, on the residual stream (block outputs): the share of patch tokens in the "
        f"outlier mode (`{CURVE_RULE}` rule, top; 0 where a block has no outlier mode) and the "
        "largest patch-token norm over the median (bottom, log scale), one colour per model."
    )
    return figure("model_curves", caption, fig)


def norm_layers(doc: RunDocument | None) -> list[SiteNorms]:
    """The per-block norms of a diagnose run's document, read as its typed results; none for
    another verb, a run that is gone (None) or results that do not follow the schema (a
    forged file: compared by its headlines, drawn as no curve)."""
    if doc is None or (doc.verb or "diagnose") != "diagnose" or doc.results is None:
        return []
    try:  # a 1.x document read as 2.0
        return DiagnoseResults.model_validate(upgrade(doc.read)["results"]).norms.layers
    except ValidationError:
        return []


def comparison_banner(documents: Sequence[RunDocument | None]) -> str | None:
    """The banners of the compared runs (synthetic models, random weights), in one paragraph:
    a comparison says what its runs' reports say in their first line."""
    from vitreg.report.render.envelope import read_banner

    banners = []
    for doc in documents:
        try:
            banner = read_banner(doc) if doc is not None and doc.model is not None else None
        except (KeyError, TypeError, AttributeError):  # a forged model block: no banner to copy
            banner = None
        if banner is not None and banner not in banners:
            banners.append(banner)
    return " ".join(banners) or None


def provenance(command: str, config: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """What made a comparison: versions, time (UTC), the command line and its settings."""
    from vitreg.results.schema import plain, utc_now, versions

    return {**versions(), "created": utc_now(), "command": command, "config": plain(config)}


def comparison_report(
    title: str,
    table: Table,
    runs: list[str],
    figures: list[Figure],
    skipped: dict[str, str] | None = None,
    notes: Sequence[str] = (),
    banner: str | None = None,
    made: Comparison | ModelComparison | None = None,
) -> Report:
    """The comparison's sections: the wide table, the curves, the runs, the skipped paths and
    (with ``made``, a comparison that keeps its provenance) the provenance; ``banner`` first."""
    from vitreg.report.render.envelope import VERSIONS, provenance_of

    sections = [Section("table", "Metrics", [*notes, table])]
    if figures:
        sections.append(
            Section(
                "curves",
                "Per-block curves",
                [FigureRef(f"figures/{f.filename}", f.caption) for f in figures],
            )
        )
    sections.append(Section("runs", "Runs", ["\n".join(runs)]))
    if skipped:
        sections.append(
            Section(
                "skipped",
                "Skipped (not runs)",
                [Table(["path", "why"], [[code(p), why] for p, why in skipped.items()])],
            )
        )
    if made is not None and made.created is not None and made.command is not None:
        versions = {k: getattr(made, k) for k in VERSIONS}
        sections.append(provenance_of(versions, made.created, made.command, made.config or {}))
    return Report(banner, title, sections)


def write_comparison(
    out: Path, data: Comparison | ModelComparison, draw: Draw, layout: Layout
) -> Path:
    """``draw()``'s figures, comparison.md and report.html in ``out``, then comparison.json
    (and, ``diagnose --models``, config.yaml: a rerun with ``--config``), through the one
    writer: a failure while rendering raises RenderError with comparison.json saved; the
    Markdown's path."""
    drawn: dict[str, Report] = {}

    def figures() -> list[Figure]:
        drawn["report"], made = draw()
        return made

    write_run(out, data, lambda _doc, _figures: drawn["report"], figures, layout=layout)
    return out / layout.markdown


def compare_report(
    data: Comparison, documents: Sequence[RunDocument | None]
) -> tuple[Report, list[Figure]]:
    """The report of ``vitreg compare`` from its comparison.json ``data`` and the runs'
    documents (None where a run is gone: no curve for it): the wide table, the curves, the
    runs' banners and the provenance kept in ``data``."""
    curves = layer_curves(list(zip(data.runs, documents, strict=True)))
    figures = [curves] if curves is not None else []
    runs = [
        f"- {code(label)}: {code(s.command or s.run)}"
        for label, s in zip(data.runs, data.sources, strict=True)
    ]
    table = wide_table(data)
    report = comparison_report(
        "vitreg compare",
        table,
        runs,
        figures,
        data.skipped,
        notes=[escape_text(n) for n in data.notes or []],
        banner=comparison_banner(documents),
        made=data,
    )
    return report, figures


def write_compare(
    out: Path, merged: Comparison, figure_format: str | None = None, command: str = ""
) -> Path:
    """The files of ``vitreg compare`` (the wide table, curves of diagnose runs, the banners of
    the runs compared, provenance) in ``out``."""
    made = provenance(command or "vitreg compare", {"figure_format": figure_format})
    rest = merged.model_dump(exclude={"verb"})
    data = Comparison.model_validate({"verb": "compare", **made, **rest})
    documents = merged.documents
    return write_comparison(out, data, lambda: compare_report(data, documents), COMPARE)


def model_comparison_report(
    data: ModelComparison, documents: Sequence[RunDocument | None]
) -> tuple[Report, list[Figure]]:
    """The report of ``vitreg diagnose --models`` from its comparison.json ``data`` and each
    model's document: the cross-model table, per-model curves, a link to each run directory,
    the models' banners and the provenance kept in ``data``."""
    labelled = [(str(m.model), d) for m, d in zip(data.runs, documents, strict=True)]
    curves = layer_curves(labelled)
    figures = [curves] if curves is not None else []
    runs = [
        f"- {code(m.model)}: [{m.run_dir}/report.md]({m.run_dir}/report.md), "
        f"[{m.run_dir}/report.html]({m.run_dir}/report.html)"
        for m in data.runs
    ]
    title = "vitreg diagnose: model comparison"
    report = comparison_report(
        title,
        rows_table(data.rows),
        runs,
        figures,
        banner=comparison_banner(documents),
        made=data,
    )
    return report, figures


def write_model_comparison(
    parent: Path,
    labelled: Sequence[tuple[str, DiagnoseResult]],
    dirs: Sequence[Path],
    documents: Sequence[RunDocument],
    config: dict[str, JsonValue] | None = None,
    command: str = "",
) -> ModelComparison:
    """The files of ``vitreg diagnose --models`` in ``parent`` from each model's results, run
    directory and metrics.json document: the cross-model table, the per-model curves (also in
    ``config``'s figure format), a link to each model's run directory, the models' banners,
    provenance and config.yaml (``config``: rerun it with ``vitreg diagnose --config``); the
    comparison.json document written."""
    meta = [
        {"model": label, "run_dir": d.name} for (label, _), d in zip(labelled, dirs, strict=True)
    ]
    made = provenance(command or "vitreg diagnose", config or {})
    rows = model_rows(list(labelled))
    data = ModelComparison.model_validate({"verb": "diagnose", **made, "runs": meta, "rows": rows})
    write_comparison(parent, data, lambda: model_comparison_report(data, documents), MODELS)
    return data


def render_comparison_again(folder: Path) -> list[Path]:
    """comparison.md and report.html of the comparison in ``folder`` rendered again from its
    comparison.json (the curves from the runs' metrics.json where they still exist)."""
    data = read_comparison(folder)  # checked and typed: its verb, runs and rows
    if isinstance(data, Comparison):
        runs: list[Path | None] = [Path(s.run) for s in data.sources]
        documents = [_saved_document(r) for r in runs]
        return render_again(folder, lambda _saved: compare_report(data, documents), COMPARE)
    # the per-model folders of `diagnose --models`, inside this one
    names = [m.run_dir for m in data.runs]
    runs = [folder / n if Path(n).name == n else None for n in names]
    documents = [_saved_document(r) for r in runs]
    return render_again(folder, lambda _saved: model_comparison_report(data, documents), COMPARE)


def _saved_document(run: Path | None) -> RunDocument | None:
    """The metrics.json document of ``run``, or None (no curve) where it is gone."""
    found = load_runs([run])[0] if run is not None else []
    return found[0][1] if found else None
