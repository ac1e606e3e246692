"""``vitreg diagnose [SPEC]``: every artifact analysis in one pass, written to a run directory
(the run is :func:`vitreg.verbs.run_diagnose`; this module parses options and prints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.output import cli_errors, console, err_console, show_notice, show_path
from vitreg.cli.progress import progress
from vitreg.configs import DiagnoseConfig


def _layer_shown(norms: Any) -> int:
    """The layer the summary reports: the strongest outlier layer, or the last block."""
    strongest = norms.report.evidence.get("strongest_layer")
    return strongest if strongest is not None else len(norms.report.layers) - 1


def _agreement(result: Any, site: str) -> str:
    """IoU of attention artifacts and norm outliers at block output ``site``, and the best layer."""
    attn = result.results.get("attention")
    if attn is None:
        return "n/a (" + result.not_applicable.get("attention", "not run") + ")"
    scored = [(a["iou"], layer) for a, layer in zip(attn.agreement, attn.layers, strict=True)]
    scored = [(iou, layer) for iou, layer in scored if iou is not None]
    entry = next((a for a in attn.agreement if a.get("norm_site") == site), None)
    if entry is None or entry.get("iou") is None or not scored:
        return "n/a"
    best, layer = max(scored, key=lambda x: x[0])
    where = f" at block {layer}" if best > 0 else ""
    return f"{entry['iou']:.2f} (best {best:.2f}{where}; vs {entry['norm_method']} outliers)"


def summary_rows(result: Any) -> dict[str, str]:
    """The console summary of one diagnose result (strings, in column order)."""
    norms = result.results["norms"]
    report = norms.report
    layer = _layer_shown(norms)
    rates = report.layers[layer].rates
    final = report.final_norm
    skipped = len(result.data.get("skipped", {}))
    converted = len(result.data.get("converted", {}))
    return {
        "verdict": "[red]artifacts[/red]" if report.verdict else "[green]no artifacts[/green]",
        "emerges at": "-" if report.emergence_layer is None else f"block {report.emergence_layer}",
        "rates at": f"block {layer}",
        **{f"{m} rate": f"{rate:.1%}" for m, rate in rates.items()},
        "after final norm (auto)": f"{final.rates['auto']:.1%}" if final else "n/a",
        "attention-norm IoU": _agreement(result, report.layers[layer].site),
        "images": f"{result.data.get('n_images', 0)} ({converted} converted, {skipped} skipped)",
    }


def show_summary(labelled: list[tuple[str, Any]]) -> None:
    """One column per model, one row per figure: verdict, emergence layer, rates, agreement."""
    rows = [summary_rows(r) for _, r in labelled]
    table = Table(title="vitreg diagnose")
    table.add_column("", style="bold")
    for label, _ in labelled:
        table.add_column(escape(label), overflow="fold")
    for key in rows[0]:
        table.add_row(key, *(row[key] for row in rows))
    console.print(table)
    console.print(
        "Rates: patch tokens above each rule's threshold on the residual stream at the layer "
        "named; top_p flags p% of tokens in any model, only `auto` (the bimodal split) decides "
        "the verdict."
    )


def run_diagnose(cfg: Any) -> None:
    """The diagnose verb on a typed :class:`~vitreg.configs.DiagnoseConfig`, then its summary."""
    from vitreg.verbs import Interrupted
    from vitreg.verbs import run_diagnose as diagnose

    try:
        with cli_errors():
            run = diagnose(cfg, progress, show_notice)
    except Interrupted as e:
        from vitreg.report.writer import again_command

        done = (
            f"the results of {e.spec} are saved in {e.saved}; `{again_command(e.saved.parent)}` "
            "renders its report"
            if e.saved is not None
            else f"no metrics.json was written for {e.spec}"
        )
        err_console.print(f"[red]interrupted: {escape(done)}[/red]")
        raise typer.Exit(code=130) from None
    show_summary(run.labelled)
    if run.comparison is not None:
        where = Path(run.comparison).parent
        show_path("comparison", run.comparison, f" and {escape(str(where / 'report.html'))}")
    for (label, _), d in zip(run.labelled, run.run_dirs, strict=True):
        show_path(f"run directory ({escape(label)})", d)


diagnose_model = opt.config_command(
    DiagnoseConfig,
    run_diagnose,
    "Find token artifacts: norms and outliers by every rule, attention sinks, LN separation.",
    argument="spec",
)
