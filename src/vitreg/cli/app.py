"""The ``vitreg`` command: a typer app with one module per verb."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from vitreg.cli import options as opt
from vitreg.cli.command import VitregCommand, VitregGroup
from vitreg.cli.output import show_path
from vitreg.verbs import VERBS, Verb

#: the help of each command group (``vitreg experiment ...``)
GROUPS = {"experiment": "Controlled experiments that train several models and compare them."}

app = typer.Typer(
    name="vitreg",
    help="Find, explain and remove token artifacts in Vision Transformers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=VitregGroup,
)


def summary(verb: Verb) -> Callable[[Any, Any], None]:
    """How the console shows ``verb``'s result: ``show_run`` of ``vitreg.cli.<verb>_cmd`` where
    that module exists, else where the run was written."""
    module = f"vitreg.cli.{verb.name}_cmd"
    if importlib.util.find_spec(module) is not None:
        return importlib.import_module(module).show_run
    return lambda run, cfg: show_path("run directory", run.run_dir)


def group(name: str) -> typer.Typer:
    """The sub-app ``vitreg NAME``, added to the app when first asked for."""
    for info in app.registered_groups:
        if info.name == name:
            return info.typer_instance
    sub = typer.Typer(
        help=GROUPS[name],
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        cls=VitregGroup,
    )
    sub.callback()(lambda: None)
    app.add_typer(sub, name=name)
    return sub


for _verb in VERBS.values():
    _target = app if _verb.group is None else group(_verb.group)
    _target.command(_verb.words[-1], cls=VitregCommand)(opt.verb_command(_verb, summary(_verb)))


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
    """Console-script entry point; a torchrun rank ends through ``distributed.exit_process``."""
    code: Any = 0
    try:
        app()
    except SystemExit as done:
        code = done.code
    # only a verb that ran imports the distributed layer (--help must not import torch)
    distributed = sys.modules.get("vitreg.distributed")
    if distributed is None or not distributed.initialized():
        raise SystemExit(code)
    if isinstance(code, str):  # sys.exit("message") prints the message and exits 1
        print(code, file=sys.stderr)
    distributed.exit_process(code if isinstance(code, int) else int(code is not None))
