"""``vitreg fix [SPEC] --neurons FILE|builtin|hf:ORG/REPO|discover``: test-time registers
with a before/after report (or a leaderboard of fix methods)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from vitreg.cli.output import console, show_line, show_path


def show_run(run: Any, cfg: Any) -> None:
    """The summary of a fix run: the before/after table, or a leaderboard's table."""
    from vitreg.verbs.result import BoardRun

    if isinstance(run, BoardRun):
        show_board(run)
    else:
        show(run.comparison, run.run_dir, run.saved)


def show_board(run: Any) -> None:
    """``--method`` other than plain ttr: the leaderboard's table on the console."""
    from vitreg.verbs.display import board_table

    table = board_table(run.leaderboard.board, reasons=False)
    shown = Table(title="vitreg fix: leaderboard")
    for column in table.header:
        shown.add_column(column)
    for row in table.rows:
        shown.add_row(*(escape(cell) for cell in row))
    console.print(shown)
    show_path("leaderboard", run.run_dir / "leaderboard.md")


def show(comparison: Any, run_dir: Path, save: Path | None) -> None:
    """The console summary: the verdict per block first, then the detection layer's numbers."""
    from vitreg.verbs.display import blocks_text

    c = comparison.results
    res, layer = c.residual, c.detect_layer
    if res.nothing_to_fix:
        show_line("no artifacts before the fix: nothing to remove (no block has an outlier mode)")
    if res.threshold_from_another_model:
        show_line(
            f"the neuron set's detection threshold ({c.threshold_value:.4g}) is above every "
            f"patch norm of this model at block {layer} (largest "
            f"{res.largest_patch_norm_before:.4g}): it was set on another model"
        )
    table = Table(title="vitreg fix")
    for column in ("", "before", "after"):
        table.add_column(column, style="bold" if not column else None)
    table.add_row(
        "verdict", "artifacts" if res.blocks_with_mode_before else "no artifacts", res.verdict
    )
    table.add_row(
        "blocks with an outlier mode",
        blocks_text(res.blocks_with_mode_before),
        blocks_text(res.blocks_with_mode_after),
    )
    ordinary = res.ordinary_max_over_median
    table.add_row(
        f"max/median patch norm (block {layer})",
        f"{res.max_over_median_before[layer]:.3g}",
        f"{res.max_over_median_after[layer]:.3g}"
        + (f" (ordinary {ordinary:.3g})" if ordinary is not None else ""),
    )
    table.add_row(
        f"patch outlier rate (block {layer})",
        f"{c.outlier_rate_before:.2%}",
        f"{c.outlier_rate_after:.2%}",
    )
    table.add_row(
        f"max patch norm (block {layer})",
        f"{c.max_patch_norm_before[layer]:.4g}",
        f"{c.max_patch_norm_after[layer]:.4g}",
    )
    table.add_row("register norm", "-", f"{c.register_norm_after[layer]:.4g}")
    cos = c.pooled_cosine
    if cos is not None:
        table.add_row("pooled embedding cosine", "", f"{cos.mean:.4f} (min {cos.min:.4f})")
    dense = c.patch_cosine
    if dense is not None:
        table.add_row("patch feature cosine", "", f"{dense.mean:.4f} (min {dense.min:.4f})")
    console.print(table)
    show_path("run directory", run_dir)
    if save is not None:
        show_line(
            f"fixed model: {escape(str(save))} (load it with vitreg.load('local:{escape(str(save))}'))"
        )
