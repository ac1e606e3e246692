"""``vitreg push DIR ORG/REPO``: upload a hub folder (``vitreg neurons --hub-dir DIR``) to the
Hugging Face hub."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from vitreg.cli.output import cli_errors, show_line, show_path


def push_command(
    directory: Path = typer.Argument(..., help="Hub folder written by `vitreg neurons --hub-dir`."),
    repo: str = typer.Argument(..., help="Hub repository ORG/REPO (created if missing)."),
    private: bool = typer.Option(False, "--private", help="Create the repository private."),
    revision: str | None = typer.Option(None, "--revision", help="Branch to commit to."),
) -> None:
    """Upload a neuron set's hub folder; the token comes from HF_TOKEN or `hf auth login`."""
    from vitreg.neurons.hub import push

    with cli_errors():
        url = push(directory, repo, private=private or None, revision=revision)
    show_path("uploaded", directory, f" to {escape(repo)}")
    show_line(f"commit: {escape(url)}")
    show_line(f"use it: vitreg fix SPEC --neurons hf:{escape(repo)}")
