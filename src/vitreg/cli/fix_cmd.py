"""``vitreg fix [SPEC] --neurons FILE|builtin|hf:ORG/REPO``: test-time registers with a before/after report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.output import cli_errors, console, show_line, show_notice, show_path
from vitreg.cli.progress import progress


def fix_command(
    ctx: typer.Context,
    spec: str | None = opt.SPEC,
    neurons: str | None = typer.Option(
        None,
        "--neurons",
        help="NeuronSet file (neurons.json from `vitreg neurons`), 'builtin' (the published "
        "set for SPEC) or hf:ORG/REPO[@REVISION] (a set on the Hugging Face hub); default: "
        "discover them first on these images.",
    ),
    method: str = typer.Option(
        "ttr",
        "--method",
        help="Fix: ttr, attention-bias, ablate, clearclip, sclip, naclip or sc-clip; a+b "
        "composes (e.g. ttr+naclip); a,b,... (or any method but ttr) writes a leaderboard "
        "against the unfixed model instead of the before/after report.",
    ),
    probe: str | None = typer.Option(
        None,
        "--probe",
        help="Leaderboard only: also score each fix with a probe, TASK:DATA (e.g. "
        "ov-seg:voc:DIR for CLIPs with a text tower, segmentation:synthetic-seg:n=32,size=112).",
    ),
    images: Path | None = opt.IMAGES,
    samples: bool = opt.SAMPLES,
    out: Path | None = opt.out_dir("fix"),
    save: Path | None = typer.Option(
        None, "--save", help="Also save the fixed model here (timm models; load it as local:DIR)."
    ),
    registers: int = typer.Option(1, "--registers", min=1, help="Test-time registers to insert."),
    cls: str = typer.Option("zero", "--cls", help="Register neurons on [CLS]: zero or keep."),
    patches: str = typer.Option(
        "zero", "--patches", help="Register neurons on patches: zero, mean or keep."
    ),
    mode: str = typer.Option(
        "paper",
        "--mode",
        help="paper (per-neuron max, Algorithm 2) or reference (the official code's edit).",
    ),
    target: float = typer.Option(
        0.01, "--target", min=0.0, max=1.0, help="Outlier rate for top-k when discovering first."
    ),
    limit: int | None = opt.LIMIT,
    batch_size: int = opt.BATCH_SIZE,
    img_size: int | None = opt.IMG_SIZE,
    random_init: bool = opt.RANDOM_INIT,
    weights: Path | None = opt.WEIGHTS,
    device: str | None = opt.DEVICE,
    figure_format: str | None = opt.FIGURE_FORMAT,
    config: Path | None = opt.CONFIG,
    overwrite: bool = opt.OVERWRITE,
) -> None:
    """Apply test-time registers and report before/after: norm maps, outlier rate, embeddings."""
    from vitreg.configs import FixConfig

    with cli_errors():
        cfg = opt.resolve_config(ctx, FixConfig, config, dict(locals()))
    run_fix_command(cfg)


def run_fix_command(cfg: Any) -> None:
    """The fix verb on a typed :class:`~vitreg.configs.FixConfig`, then its summary."""
    from vitreg.verbs import run_fix

    if cfg.method != "ttr":
        run_board_command(cfg)
        return
    with cli_errors():
        run = run_fix(cfg, progress, show_notice)
    show(run.comparison, run.run_dir, run.saved)


def run_board_command(cfg: Any) -> None:
    """``--method`` other than plain ttr: the leaderboard, then its table on the console."""
    from vitreg.report.fix_board import board_table
    from vitreg.verbs.fix_board import run_fix_board

    with cli_errors():
        run = run_fix_board(cfg, progress, show_notice)
    table = board_table(run.board.to_dict(), reasons=False)
    shown = Table(title="vitreg fix: leaderboard")
    for column in table.header:
        shown.add_column(column)
    for row in table.rows:
        shown.add_row(*(escape(cell) for cell in row))
    console.print(shown)
    show_path("leaderboard", run.run_dir / "leaderboard.md")


def show(comparison: Any, run_dir: Path, save: Path | None) -> None:
    """The console summary: the verdict per block first, then the detection layer's numbers."""
    from vitreg.report.fix_report import blocks_text

    c = comparison.to_dict()
    res = c["residual"]
    layer = c["detect_layer"]
    if res["nothing_to_fix"]:
        show_line("no artifacts before the fix: nothing to remove (no block has an outlier mode)")
    if res["threshold_from_another_model"]:
        show_line(
            f"the neuron set's detection threshold ({c['threshold_value']:.4g}) is above every "
            f"patch norm of this model at block {layer} (largest "
            f"{res['largest_patch_norm_before']:.4g}): it was set on another model"
        )
    table = Table(title="vitreg fix")
    for column in ("", "before", "after"):
        table.add_column(column, style="bold" if not column else None)
    table.add_row(
        "verdict", "artifacts" if res["blocks_with_mode_before"] else "no artifacts", res["verdict"]
    )
    table.add_row(
        "blocks with an outlier mode",
        blocks_text(res["blocks_with_mode_before"]),
        blocks_text(res["blocks_with_mode_after"]),
    )
    ordinary = res["ordinary_max_over_median"]
    table.add_row(
        f"max/median patch norm (block {layer})",
        f"{res['max_over_median_before'][layer]:.3g}",
        f"{res['max_over_median_after'][layer]:.3g}"
        + (f" (ordinary {ordinary:.3g})" if ordinary is not None else ""),
    )
    table.add_row(
        f"patch outlier rate (block {layer})",
        f"{c['outlier_rate_before']:.2%}",
        f"{c['outlier_rate_after']:.2%}",
    )
    table.add_row(
        f"max patch norm (block {layer})",
        f"{c['max_patch_norm_before'][layer]:.4g}",
        f"{c['max_patch_norm_after'][layer]:.4g}",
    )
    table.add_row("register norm", "-", f"{c['register_norm_after'][layer]:.4g}")
    cos = c["pooled_cosine"]
    if cos is not None:
        table.add_row("pooled embedding cosine", "", f"{cos['mean']:.4f} (min {cos['min']:.4f})")
    dense = c["patch_cosine"]
    if dense is not None:
        table.add_row("patch feature cosine", "", f"{dense['mean']:.4f} (min {dense['min']:.4f})")
    console.print(table)
    show_path("run directory", run_dir)
    if save is not None:
        show_line(
            f"fixed model: {escape(str(save))} (load it with vitreg.load('local:{escape(str(save))}'))"
        )
