"""mkdocs hook: a marker ``<!-- vitreg:options VERB -->`` on a page becomes the table of that
command's arguments and options, read from the command `vitreg VERB --help` shows (itself
generated from the verb's typed config in ``vitreg.configs``), so no option is written twice."""

from __future__ import annotations

import re
from typing import Any

import typer.main

MARKER = re.compile(r"<!-- vitreg:options ([a-z ]+?) -->")
PUBLISHED = "<!-- vitreg:ov-seg-published -->"


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


def published_table() -> str:
    """The Markdown table of every method's published ov-seg settings, read from the data file
    ``--protocol published`` runs them from."""
    from vitreg.probe.protocols import published

    rows = [
        "| method | benchmark | short side | logit scale | prob thd | area thd | crop / stride "
        "| PAMR | class names | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, method in published().methods.items():
        for benchmark, e in method.benchmarks.items():
            crop = "whole image" if e.slide_crop == 0 else f"{e.slide_crop} / {e.slide_stride}"
            pamr = (
                f"{e.pamr_steps} at {', '.join(map(str, e.pamr_dilations))}"
                if e.pamr_steps
                else "off"
            )
            cells = [name, benchmark, e.short_side, f"{e.logit_scale:g}", f"{e.prob_thd:g}",
                     e.area_thd if e.area_thd is not None else "–", crop, pamr, f"`{e.names}`",
                     f"`{e.source}`"]  # fmt: skip
            rows.append("| " + " | ".join(cell(str(c)) for c in cells) + " |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    """Expand every options marker of a page, and the published ov-seg settings' marker."""
    if PUBLISHED in markdown:
        markdown = markdown.replace(PUBLISHED, published_table())
    return MARKER.sub(lambda m: options_table(m.group(1)), markdown)
