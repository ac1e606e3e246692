"""``vitreg experiment variants --data D``: train, probe and diagnose the ViT variant grid and
write one comparison report (register with ``app.add_typer(experiment_app, name="experiment")``)."""

from __future__ import annotations

from typing import Any

import typer

from vitreg.cli import options as opt
from vitreg.cli.command import VitregCommand, VitregGroup
from vitreg.cli.output import cli_errors, show_notice, show_path
from vitreg.cli.progress import progress
from vitreg.configs import ExperimentConfig

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


experiment_app.command("variants", cls=VitregCommand)(
    opt.config_command(
        ExperimentConfig,
        run_experiment,
        """Train baseline, +norm/LS and +early-QKV ViTs x {none, registers, attention bias}
        (and the GAP baseline), probe and diagnose each, and write one comparison report.""",
        flags={"include_gap": "--include-gap/--no-gap"},
    )
)
