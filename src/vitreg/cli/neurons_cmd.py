"""``vitreg neurons [SPEC]``: find register neurons, calibrate top-k on held-out images, save them."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from vitreg.cli.output import console, show_line, show_path


def show_run(run: Any, cfg: Any) -> None:
    """The summary of a neurons run, and how to upload its hub folder."""
    show(run.found, run.spec, run.run_dir)
    if cfg.hub_dir is not None:
        show_path("hub folder", cfg.hub_dir)
        show_line(f"upload: {escape(f'vitreg push {shlex.quote(str(cfg.hub_dir))} ORG/REPO')}")


def show(found: Any, spec: str, run_dir: Path) -> None:
    """The console summary: the verdict after the fix first, then what was chosen and why."""
    held = found.held_out
    table = Table(title="vitreg neurons", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    left = held.blocks_with_outlier_mode_after
    verdict = (
        "no artifacts after the fix (no outlier mode at any block)"
        if found.status == "clean"
        else f"PARTIAL: outlier mode still at blocks {left}"
        if left
        else "PARTIAL: max/median patch norm still above the ordinary level"
    )
    layers = ", ".join(f"{r.layer} ({r.n_neurons})" for r in found.layers)
    how = (
        "causal selection + calibration"
        if found.causal is not None
        else f"top-k {found.top_k_mode}"
    )
    rows = {
        "held-out verdict": verdict,
        "max/median patch norm": f"{held.max_over_median_before:.3g} -> "
        f"{held.max_over_median_after:.3g} (ordinary patches: "
        f"{held.ordinary_max_over_median:.3g})",
        "neurons": f"{len(found.chosen)} ({how})",
        "layers (count)": layers,
        "searched": found.reasons["highest_layer"],
        **(
            {
                "stability (halves)": f"overlap {found.stability.overlap_between_halves:.0%} "
                "between the sets of two halves of the images"
            }
            if found.stability
            else {}
        ),
        **(
            {
                "other sizes": ", ".join(
                    f"{r.img_size} px: "
                    + ("clean" if r.clean_after else f"NOT clean ({r.max_over_median_after:.3g})")
                    for r in found.other_sizes.sizes
                )
            }
            if found.other_sizes
            else {}
        ),
        "detection": f"block {found.detect_layer}, {found.threshold} threshold",
        "held-out outlier rate": f"{held.outlier_rate_before:.2%} -> "
        f"{held.outlier_rate_after:.2%} ({held.n_images} images)",
    }
    for key, value in rows.items():
        table.add_row(key, escape(value))
    console.print(table)
    for note in found.notes:
        console.print(f"[yellow]note: {escape(note)}[/yellow]")
    show_path("run directory", run_dir)
    neurons = shlex.quote(str(run_dir / "neurons.json"))
    show_line(f"next: {escape(f'vitreg fix {shlex.quote(spec)} --neurons {neurons}')}")
