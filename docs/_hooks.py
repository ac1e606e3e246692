"""mkdocs hook: a marker ``<!-- vitreg:options VERB -->`` on a page becomes the table of that
command's arguments and options, read from the command `vitreg VERB --help` shows (itself
generated from the verb's typed config in ``vitreg.configs``), so no option is written twice."""

from __future__ import annotations

import re
from typing import Any

import typer.main

MARKER = re.compile(r"<!-- vitreg:options ([a-z ]+?) -->")


def command(words: str) -> Any:
    """The click command of ``vitreg WORDS`` (``experiment variants`` for a group's command)."""
    from vitreg.cli.app import app

    found = typer.main.get_command(app)
    for word in words.split():
        if word not in getattr(found, "commands", {}):
            raise ValueError(f"no command 'vitreg {words}' for the options marker")
        found = found.commands[word]
    return found


def cell(text: str) -> str:
    """``text`` fit for one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def options_table(words: str) -> str:
    """The Markdown table of ``vitreg WORDS``'s arguments and options, as ``--help`` gives them."""
    cmd = command(words)
    ctx = cmd.context_class(cmd, info_name=f"vitreg {words}")
    rows = ["| argument or option | what it sets |", "|---|---|"]
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or param.name == "help":
            continue
        name, text = record
        rows.append(f"| `{cell(name)}` | {cell(text)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    """Expand every options marker of a page."""
    return MARKER.sub(lambda m: options_table(m.group(1)), markdown)
