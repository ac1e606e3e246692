"""``vitreg push DIR ORG/REPO``: where a hub folder was uploaded, and how to use it."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from vitreg.cli.output import show_line, show_path


def show_run(run: Any, cfg: Any) -> None:
    """The repository and commit uploaded to, and the fix command that reads it."""
    show_path("uploaded", run.directory, f" to {escape(run.repo)}")
    show_line(f"commit: {escape(run.url)}")
    show_line(f"use it: vitreg fix SPEC --neurons hf:{escape(run.repo)}")
