"""The ``vitreg`` command: a typer app with one module per verb."""

from __future__ import annotations

import os

import typer

from vitreg.cli.command import VitregCommand, VitregGroup
from vitreg.cli.diagnose_cmd import diagnose_model
from vitreg.cli.experiment_cmd import experiment_app
from vitreg.cli.fix_cmd import fix_command
from vitreg.cli.inspect_cmd import inspect_model
from vitreg.cli.models_cmd import models
from vitreg.cli.neurons_cmd import neurons_command
from vitreg.cli.probe_cmd import compare_command, probe_command
from vitreg.cli.push_cmd import push_command
from vitreg.cli.report_cmd import report_command
from vitreg.cli.schema_cmd import schema_command
from vitreg.cli.train_cmd import train_command
from vitreg.cli.validate_cmd import validate_command
from vitreg.cli.vlm_cmd import vlm_command

app = typer.Typer(
    name="vitreg",
    help="Find, explain and remove token artifacts in Vision Transformers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=VitregGroup,
)
app.command("models", cls=VitregCommand)(models)
app.command("inspect", cls=VitregCommand)(inspect_model)
app.command("diagnose", cls=VitregCommand)(diagnose_model)
app.command("neurons", cls=VitregCommand)(neurons_command)
app.command("fix", cls=VitregCommand)(fix_command)
app.command("probe", cls=VitregCommand)(probe_command)
app.command("compare", cls=VitregCommand)(compare_command)
app.command("report", cls=VitregCommand)(report_command)
app.command("schema", cls=VitregCommand)(schema_command)
app.command("train", cls=VitregCommand)(train_command)
app.command("validate", cls=VitregCommand)(validate_command)
app.command("vlm", cls=VitregCommand)(vlm_command)
app.command("push", cls=VitregCommand)(push_command)
app.add_typer(experiment_app, name="experiment")


def _version(value: bool) -> None:
    if value:
        from vitreg import __version__

        typer.echo(f"vitreg {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show the full traceback of an unexpected error (a bug)."
    ),
) -> None:
    """Find, explain and remove token artifacts in Vision Transformers."""
    # vitreg shows its own progress: the Hugging Face libraries' tqdm bars (downloads, checkpoint
    # shards) stay off unless the user asks for them (HF_HUB_DISABLE_PROGRESS_BARS=0)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main() -> None:
    """Console-script entry point."""
    app()
