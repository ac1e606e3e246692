"""The report structure every verb shares (sections of paragraphs, tables and figures),
number and name formatting, and rendering to Markdown. The sections every run has (model,
images, provenance) are in :mod:`vitreg.report.render.envelope`; each verb's own sections in
``report/renderers/``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class FigureRef:
    filename: str
    caption: str


Block = str | Table | FigureRef  # a str is a paragraph (**bold** and `code` allowed)


@dataclass
class Section:
    key: str
    title: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Report:
    banner: str | None
    title: str
    sections: list[Section]


def num(x: Any, digits: int = 3) -> str:
    """A number as text (``–`` for missing)."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}g}"


def text(x: Any) -> str:
    """A value as text: ``–`` for missing, JSON for lists and dicts (never a Python repr)."""
    if x is None:
        return "–"
    if isinstance(x, (dict, list, tuple)):
        return json.dumps(x, default=str)
    return num(x) if isinstance(x, (bool, int, float)) else str(x)


def code(x: Any) -> str:
    """A value as inline code (``–`` for missing), fenced by :func:`code_span` so a backtick,
    ``|`` or ``<tag>`` in it (a path, a command line) stays literal."""
    return "–" if x is None or x == "" else code_span(text(x))


def pct(x: Any) -> str:
    return "–" if x is None else f"{100 * x:.2f}%"


def finite(x: Any) -> bool:
    """Whether ``x`` is a real number (not None, NaN, infinite or a bool)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def figure_section(title: str, figures: list[Any]) -> Section:
    """A section holding every figure (file and caption) under ``title``."""
    return Section(
        "figures", title, [FigureRef(f"figures/{f.filename}", f.caption) for f in figures]
    )


def render_markdown(report: Report) -> str:
    """The report as Markdown; its first line is the synthetic-model banner when there is one."""
    lines: list[str] = []
    if report.banner:
        lines += [report.banner, ""]
    lines += [f"# {report.title}", ""]
    for s in report.sections:
        lines += [f"## {s.title}", ""]
        for b in s.blocks:
            lines += [*_md_block(b), ""]
    return "\n".join(lines).rstrip() + "\n"


def markdown_table(table: Table) -> str:
    """A table as GitHub-flavoured Markdown, one line per row; every report table is rendered here."""
    row = lambda cells: "| " + " | ".join(map(_cell, cells)) + " |"  # noqa: E731
    lines = [row(table.header), "|" + "---|" * len(table.header), *map(row, table.rows)]
    return "\n".join(lines) + "\n"


def _cell(x: Any) -> str:
    """A cell's text: ``|`` escaped, line breaks as spaces (a table row is one line)."""
    text = str(x).replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("|", "\\|").replace("\n", " ")


def code_span(x: Any) -> str:
    """``x`` (a file name, a path, a spec) as one inline code span whatever it holds: fenced by
    more backticks than its longest backtick run (CommonMark), padded when it starts or ends with
    one, line breaks as spaces; ``<tags>`` and ``*`` inside a code span are shown, not rendered,
    and in a table cell ``|`` is escaped by the table writer. The one writer of names in reports."""
    import re

    text = " ".join(str(x).splitlines()) or " "
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" or text.strip(" ") == "" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def escape_text(x: Any) -> str:
    """Free text that may hold file names (a skip reason quoting a path) with every Markdown and
    HTML marker backslash-escaped, so it shows as written (``|`` is left to the table writer)."""
    import re

    return re.sub(r"([\\`*_\[\]<>~&#!])", r"\\\1", " ".join(str(x).splitlines()))


def inline_text(x: Any) -> str:
    """User-supplied text (a model spec, a note, a data description) for one Markdown line:
    line breaks as spaces, ``<``, ``>`` and ``&`` as HTML entities, and the markers that would
    make a code span or a link (backticks, brackets, backslashes) escaped; anything else as
    written, so that plain text comes out unchanged."""
    import re

    line = " ".join(str(x).splitlines())
    line = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([`\[\]\\])", r"\\\1", line)


def _md_block(b: Block) -> list[str]:
    if isinstance(b, Table):
        return markdown_table(b).splitlines()
    if isinstance(b, FigureRef):
        stem = b.filename.rsplit("/", 1)[-1].removesuffix(".png")
        return [f"![{stem}]({b.filename})", "", f"*{b.caption}*"]
    return [b]
