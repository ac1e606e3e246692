"""``vitreg experiment variants --data D``: train, probe and diagnose the ViT variant grid and
write one comparison report (register with ``app.add_typer(experiment_app, name="experiment")``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from vitreg.cli import options as opt
from vitreg.cli.command import VitregCommand, VitregGroup
from vitreg.cli.output import cli_errors, show_notice, show_path
from vitreg.cli.progress import progress

experiment_app = typer.Typer(
    help="Controlled experiments that train several models and compare them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=VitregGroup,
)


@experiment_app.callback()
def experiment() -> None:
    """Controlled experiments that train several models and compare them."""


@experiment_app.command("variants", cls=VitregCommand)
def variants_command(
    ctx: typer.Context,
    data: str | None = typer.Option(
        None,
        "--data",
        help="Dataset spec or image folder: synthetic:n=256,size=48 (labels, masks, depth: all "
        "probes) or imagefolder:DIR (labels only: classification probe only); required unless "
        "--config gives it.",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Experiment folder (default runs/<time>_variants_experiment)."
    ),
    size: str | None = typer.Option(
        None, "--size", help="tiny (default on CPU, ~1 min per variant) or small (default on GPU)."
    ),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Training steps per variant."),
    recipe: str = typer.Option(
        "dino", "--recipe", help="dino (default: the dense iBOT loss the gains need) or supervised."
    ),
    include_gap: bool = typer.Option(
        True, "--include-gap/--no-gap", help="Add the GAP baseline (average pooling, no [CLS])."
    ),
    finetune: str | None = typer.Option(
        None,
        "--finetune",
        help="Also fine-tune this timm ViT as is and converted to +early QKV (random init "
        "unless --pretrained).",
    ),
    pretrained: bool = typer.Option(
        False, "--pretrained", help="Load --finetune's timm weights (needs them cached or online)."
    ),
    seeds: int | None = typer.Option(
        None, "--seeds", min=1, help="Training seeds per variant (default 1; 3 measures noise)."
    ),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help="Global batch."),
    threads: int | None = typer.Option(
        None, "--threads", min=1, help="torch CPU threads (default: 1 for tiny on CPU)."
    ),
    figure_format: str | None = opt.FIGURE_FORMAT,
    config: Path | None = opt.CONFIG,
    overwrite: bool = opt.OVERWRITE,
) -> None:
    """Train baseline, +norm/LS and +early-QKV ViTs x {none, registers, attention bias} (and the
    GAP baseline), probe and diagnose each, and write one comparison report."""
    from vitreg.cli.train_cmd import without_none
    from vitreg.configs import ExperimentConfig

    params = dict(locals())
    with cli_errors():
        cfg = opt.resolve_config(ctx, ExperimentConfig, config, without_none(params))
    run_experiment(cfg)


def run_experiment(cfg: Any) -> None:
    """The experiment verb on a typed :class:`~vitreg.configs.ExperimentConfig`, then where its
    report is."""
    from vitreg.verbs import run_experiment as experiment

    with cli_errors():
        run = experiment(cfg, progress, show_notice)
    show_path(
        f"{len(run.experiment.variants)} variants in {run.seconds:.0f} s; report",
        run.run_dir / "report.md",
        " (metrics.json, report.html, figures/)",
    )
