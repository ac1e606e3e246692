"""``vitreg probe SPEC --task T --data D [--fix ...]``: frozen-feature probes, base and fixed side
by side; ``vitreg compare RUN...``: the headline metrics of several runs in one table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.output import cli_errors, console, show_notice, show_path
from vitreg.cli.progress import progress
from vitreg.configs import Figures, ProbeRunConfig, RunConfig
from vitreg.core.out_dir import check_out
from vitreg.core.run_dir import session

# a Δ's verdict in the console table (short, so the table fits 100 columns)
DELTA_WORDS = {
    "better": "better",
    "worse": "worse",
    "within noise": "noise",
    "no interval": "no CI",
}


def run_probe(cfg: Any) -> None:
    """The probe verb on a typed :class:`~vitreg.configs.ProbeRunConfig`, then its summary."""
    from vitreg.verbs import run_probe as probe

    with cli_errors():
        run = probe(cfg, progress, show_notice)
    if run.document is not None:  # under torchrun only rank 0 scores and writes
        show(run.probe, run.run_dir)


probe_command = opt.config_command(
    ProbeRunConfig,
    run_probe,
    "Linear probes on frozen tokens, with and without test-time registers.",
    argument="spec",
)


def block_name(layer: str) -> str:
    """A block output's name as the console shows it: ``blocks.11``."""
    return layer.removesuffix(".hook_resid_post")


def show(doc: dict[str, Any], run_dir: Path) -> None:
    """Console table: every score, base and fixed side by side, the Δ with its verdict, and
    the yardsticks each layer's scores are read against."""
    from vitreg.report.renderers.probe import verdict
    from vitreg.results.probe import ProbeResults

    conditions = list(doc["conditions"])
    both = len(conditions) == 2
    layers = next(iter(doc["conditions"].values()))
    many = len(layers) > 1  # one layer: named in the title, not on every row
    grouped = any(
        s["group"] != "all" for ls in doc["conditions"].values() for x in ls for s in x["scores"]
    )
    where = "" if many else f" at {block_name(layers[0]['layer'])}"
    table = Table(title=f"vitreg probe: {doc['task']}{escape(where)}")
    labels = ["layer"] * many + ["feature"] + ["tokens"] * grouped + ["metric"]
    longest = {
        "layer": max(len(block_name(x["layer"])) for x in layers),
        "feature": max((len(s["feature"]) for x in layers for s in x["scores"]), default=7),
    }
    for column in labels:  # each row keeps its whole, unique label; the numbers wrap first
        table.add_column(column, no_wrap=True, min_width=longest.get(column))
    for column in [*conditions, *["Δ"] * both]:
        table.add_column(column)
    deltas = {(d["layer"], d["feature"], d["group"], d["metric"]): d for d in doc["deltas"]}
    for li, layer in enumerate(layers):
        by_key: dict[tuple, list[str]] = {}
        for ci, c in enumerate(conditions):
            for s in doc["conditions"][c][li]["scores"]:
                key = (s["feature"], s["group"], s["metric"])
                cell = "–" if s["mean"] is None else f"{s['mean']:.4g}"
                if s["ci95"] is not None:
                    cell += f" ± {s['ci95']:.2g}"
                by_key.setdefault(key, ["–"] * len(conditions))[ci] = cell
        if li:
            table.add_section()
        for row, ((feature, group, metric), cells) in enumerate(by_key.items()):
            d = deltas.get((layer["layer"], feature, group, metric))
            extra = [f"{d['delta']:+.3g} ({DELTA_WORDS[d['verdict']]})" if d else "–"] * both
            name = [escape(block_name(layer["layer"])) if row == 0 else ""] * many
            table.add_row(*name, escape(feature), *[group] * grouped, metric, *cells, *extra)
    console.print(table, crop=False)
    for layer in next(iter(doc["conditions"].values())):
        marks = [
            f"{y['name']} {y['metric']}{'' if y['group'] == 'all' else '/' + y['group']} "
            f"{'–' if y['value'] is None else format(y['value'], '.4g')}"
            for y in layer.get("yardsticks", [])
        ]
        if marks:
            name = escape(layer["layer"].removesuffix(".hook_resid_post"))
            console.print(f"yardsticks at {name}: " + escape(", ".join(marks)))
    for c in conditions:
        scores = [s for layer in doc["conditions"][c] for s in layer["scores"]]
        judged = [s for s in scores if s.get("vs_yardsticks")]
        short = [s for s in judged if set(s["vs_yardsticks"].values()) != {"better"}]
        if short:
            console.print(
                f"[yellow]{c}: {len(short)} of {len(judged)} scores do not clearly beat every "
                "yardstick (95% interval); see the report's vs yardsticks column[/yellow]"
            )
    if both:
        console.print(
            "Δ = fixed − base: better/worse only when the 95% intervals separate, else noise "
            "(within noise) or no CI (one seed)"
        )
    console.print(f"[bold]verdict:[/bold] {escape(verdict(ProbeResults.model_validate(doc)))}")
    show_path("run directory", run_dir)


def compare_line(runs: list[Path], out: Path, contains: str | None) -> str:
    """The command line of a ``vitreg compare`` that wrote ``out``."""
    import shlex

    parts = ["vitreg", "compare", *map(str, runs), "--out", str(out)]
    return shlex.join(parts + (["--filter", contains] if contains is not None else []))


def compare_command(
    runs: list[Path] = typer.Argument(..., help="Run directories (each with a metrics.json)."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Also write comparison.md, report.html (wide table, curves) and comparison.json here.",
    ),
    contains: str | None = typer.Option(
        None, "--filter", help="Only metrics whose name contains this text."
    ),
    overwrite: bool = opt.field_option(RunConfig, "overwrite"),
    figure_format: str | None = opt.field_option(Figures, "figure_format"),
) -> None:
    """Merge the headline metrics of several runs: run, metric, value, direction (folders that
    are not runs are skipped with a note)."""
    from vitreg.errors import InputError
    from vitreg.report.compare import compare_runs, long_rows, write_compare
    from vitreg.report.render.markdown import num
    from vitreg.report.render.plots import VECTOR_FORMATS

    with cli_errors(), session():  # the --out claimed inside is released at the end
        if out is not None:
            check_out(out, "compare", None, overwrite)
        merged = compare_runs(runs, contains)
        if out is not None:
            if figure_format not in (None, *VECTOR_FORMATS):
                raise InputError(f"--figure-format: choose svg or pdf (got {figure_format!r})")
            write_compare(out, merged, figure_format, compare_line(runs, out, contains))
    for path, why in merged["skipped"].items():
        console.print(f"[yellow]skipped {escape(path)}: {escape(why)}[/yellow]")
    table = Table(title="vitreg compare")
    table.add_column("run", overflow="fold", max_width=28)
    table.add_column("metric", overflow="fold")
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("direction", no_wrap=True)
    previous = None
    for row in long_rows(merged):
        run = "" if row["run"] == previous else row["run"]
        if run and previous is not None:
            table.add_section()
        previous = row["run"]
        table.add_row(escape(run), escape(row["metric"]), num(row["value"], 4), row["direction"])
    console.print(table)
    if out is not None:
        show_path("written", out, " (comparison.md, report.html, comparison.json)")
