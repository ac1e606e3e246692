"""``vitreg diagnose [SPEC]``: every artifact analysis in one pass, written to a run directory
(the run is :func:`vitreg.verbs.run_diagnose`; this module prints its summary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from vitreg.cli.output import console, show_path


def _layer_shown(norms: Any) -> int:
    """The layer the summary reports: the strongest outlier layer, or the last block."""
    strongest = norms.evidence.strongest_layer
    return strongest if strongest is not None else len(norms.layers) - 1


def _agreement(results: Any, site: str) -> str:
    """IoU of attention artifacts and norm outliers at block output ``site``, and the best layer."""
    attn = results.attention
    if attn is None:
        return "n/a (" + results.not_applicable.get("attention", "not run") + ")"
    scored = [(a.iou, layer) for a, layer in zip(attn.agreement, attn.layers, strict=True)]
    scored = [(iou, layer) for iou, layer in scored if iou is not None]
    entry = next((a for a in attn.agreement if a.norm_site == site), None)
    if entry is None or entry.iou is None or not scored:
        return "n/a"
    best, layer = max(scored, key=lambda x: x[0])
    where = f" at block {layer}" if best > 0 else ""
    return f"{entry.iou:.2f} (best {best:.2f}{where}; vs {entry.norm_method} outliers)"


def summary_rows(result: Any) -> dict[str, str]:
    """The console summary of one diagnose result (strings, in column order)."""
    report = result.results.norms
    layer = _layer_shown(report)
    rates = report.layers[layer].outlier_rate
    final = report.after_final_norm
    skipped, converted = len(result.data.skipped), len(result.data.converted)
    return {
        "verdict": "[red]artifacts[/red]"
        if report.artifacts_present
        else "[green]no artifacts[/green]",
        "emerges at": "-" if report.emergence_layer is None else f"block {report.emergence_layer}",
        "rates at": f"block {layer}",
        **{f"{m} rate": f"{rate:.1%}" for m, rate in rates.items()},
        "after final norm (auto)": f"{final.outlier_rate['auto']:.1%}" if final else "n/a",
        "attention-norm IoU": _agreement(result.results, report.layers[layer].site),
        "images": f"{result.data.n_images} ({converted} converted, {skipped} skipped)",
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


def show_run(run: Any, cfg: Any) -> None:
    """The summary of a diagnose run: one column per model, then where each run was written."""
    show_summary(run.labelled)
    if run.comparison is not None:
        where = Path(run.comparison).parent
        show_path("comparison", run.comparison, f" and {escape(str(where / 'report.html'))}")
    for (label, _), d in zip(run.labelled, run.run_dirs, strict=True):
        show_path(f"run directory ({escape(label)})", d)
