"""``vitreg probe SPEC --task T --data D [--fix ...]``: the console summary of frozen-feature
probes, base and fixed side by side."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from vitreg.cli.output import console, show_path

if TYPE_CHECKING:
    from vitreg.verbs.probe import ProbeResults

# a Δ's verdict in the console table (short, so the table fits 100 columns)
DELTA_WORDS = {
    "better": "better",
    "worse": "worse",
    "within noise": "noise",
    "no interval": "no CI",
}


def show_run(run: Any, cfg: Any) -> None:
    """The summary of a probe run (under torchrun only rank 0 scores and writes)."""
    if run.document is not None and run.probe is not None:
        show(run.probe, run.run_dir, run.verdict)


def block_name(layer: str) -> str:
    """A block output's name as the console shows it: ``blocks.11``."""
    return layer.removesuffix(".hook_resid_post")


def show(results: ProbeResults, run_dir: Path, verdict: str) -> None:
    """Console table: every score, base and fixed side by side, the Δ with its verdict, and
    the yardsticks each layer's scores are read against; then the run's ``verdict``."""
    conditions = list(results.conditions)
    both = len(conditions) == 2
    layers = next(iter(results.conditions.values()))
    many = len(layers) > 1  # one layer: named in the title, not on every row
    grouped = any(
        s.group != "all" for ls in results.conditions.values() for x in ls for s in x.scores
    )
    where = "" if many else f" at {block_name(layers[0].layer)}"
    table = Table(title=f"vitreg probe: {results.task}{escape(where)}")
    labels = ["layer"] * many + ["feature"] + ["tokens"] * grouped + ["metric"]
    longest = {
        "layer": max(len(block_name(x.layer)) for x in layers),
        "feature": max((len(s.feature) for x in layers for s in x.scores), default=7),
    }
    for column in labels:  # each row keeps its whole, unique label; the numbers wrap first
        table.add_column(column, no_wrap=True, min_width=longest.get(column))
    for column in [*conditions, *["Δ"] * both]:
        table.add_column(column)
    deltas = {(d.layer, d.feature, d.group, d.metric): d for d in results.deltas}
    for li, layer in enumerate(layers):
        by_key: dict[tuple[str, str, str], list[str]] = {}
        for ci, c in enumerate(conditions):
            for s in results.conditions[c][li].scores:
                cell = "–" if s.mean is None else f"{s.mean:.4g}"
                if s.ci95 is not None:
                    cell += f" ± {s.ci95:.2g}"
                by_key.setdefault((s.feature, s.group, s.metric), ["–"] * len(conditions))[ci] = (
                    cell
                )
        if li:
            table.add_section()
        for row, ((feature, group, metric), cells) in enumerate(by_key.items()):
            d = deltas.get((layer.layer, feature, group, metric))
            extra = [f"{d.delta:+.3g} ({DELTA_WORDS[d.verdict]})" if d else "–"] * both
            name = [escape(block_name(layer.layer)) if row == 0 else ""] * many
            table.add_row(*name, escape(feature), *[group] * grouped, metric, *cells, *extra)
    console.print(table, crop=False)
    _yardsticks(results)
    _short_of_yardsticks(results)
    if both:
        console.print(
            "Δ = fixed − base: better/worse only when the 95% intervals separate, else noise "
            "(within noise) or no CI (one seed)"
        )
    console.print(f"[bold]verdict:[/bold] {escape(verdict)}")
    show_path("run directory", run_dir)


def _yardsticks(results: ProbeResults) -> None:
    """The yardsticks of each layer, one line per layer that has any."""
    for layer in next(iter(results.conditions.values())):
        marks = [
            f"{y.name} {y.metric}{'' if y.group == 'all' else '/' + y.group} "
            f"{'–' if y.value is None else format(y.value, '.4g')}"
            for y in layer.yardsticks
        ]
        if marks:
            name = escape(layer.layer.removesuffix(".hook_resid_post"))
            console.print(f"yardsticks at {name}: " + escape(", ".join(marks)))


def _short_of_yardsticks(results: ProbeResults) -> None:
    """A warning per condition whose scores do not all clearly beat every yardstick."""
    for c, layers in results.conditions.items():
        judged = [s for layer in layers for s in layer.scores if s.vs_yardsticks]
        short = [s for s in judged if set(s.vs_yardsticks.values()) != {"better"}]
        if short:
            console.print(
                f"[yellow]{c}: {len(short)} of {len(judged)} scores do not clearly beat every "
                "yardstick (95% interval); see the report's vs yardsticks column[/yellow]"
            )
