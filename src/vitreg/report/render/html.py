"""Self-contained report.html: the Markdown report's sections, figures as data URIs, a block
slider.

Paragraphs, table cells, captions and the banner are Markdown rendered by markdown-it-py (a
dependency of rich), with raw HTML escaped, so the page shows no Markdown markers. The slider
draws maps over the input images on canvases from JSON embedded in the page (a verb's renderer
makes it; maps are tiny: h*w numbers per layer per image), so the file stays small and opens
offline: no CDN, no external file.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from pydantic import JsonValue

from vitreg.report.render.images import display_uri
from vitreg.report.render.markdown import FigureRef, Report, Table
from vitreg.report.render.plots import CLIP_TEXT

# a number (1.5, -3e-05, 12%, 2.1×), a missing value (–), yes/no, or a range of numbers
_NUMBER = r"[-+−]?(\d[\d,]*\.?\d*|\.\d+)(e[-+]?\d+)?\s*[%×x]?"
NUMERIC = re.compile(rf"–|yes|no|{_NUMBER}(\s*[±–-]\s*{_NUMBER})?(\s*\(.*\))?", re.IGNORECASE)


@cache
def _markdown() -> Any:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table")


def inline(text: Any) -> Any:
    """One line of Markdown (a cell, a caption) as HTML: **bold**, *em*, `code`; HTML escaped."""
    from markupsafe import Markup

    return Markup(_markdown().renderInline(str(text)))


def plain(text: Any) -> str:
    """One line of Markdown as plain text (for attributes such as an image's alt text)."""
    return inline(text).striptags()


def markdown(text: Any) -> Any:
    """A Markdown block (a paragraph, a list) as HTML, raw HTML escaped."""
    from markupsafe import Markup

    return Markup(_markdown().render(str(text)))


def render_html(report: Report, figures: list[Any], slider: dict[str, JsonValue] | None) -> str:
    """The whole report as one HTML page with every figure embedded."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("vitreg.report.render", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["inline"] = inline
    env.filters["markdown"] = markdown
    env.filters["plain"] = plain
    env.filters["columns"] = column_aligns
    uris = {f"figures/{f.filename}": display_uri(f.png) for f in figures}
    slider_json = json.dumps(slider, separators=(",", ":")).replace("</", "<\\/")
    return env.get_template("report.html.j2").render(
        report=report,
        uris=uris,
        slider_json=slider_json,
        has_slider=slider is not None,
        clip_text=CLIP_TEXT,
        kind=_kind,
    )


def align(cell: Any) -> str:
    """A table cell's CSS class: ``num`` (right-aligned) for a number, a share, a range of
    numbers or a missing value; ``txt`` (left-aligned) for prose, names and code."""
    return "num" if NUMERIC.fullmatch(str(cell).strip()) else "txt"


def column_aligns(table: Table) -> list[str]:
    """Each column's CSS class, for its header and every cell: ``num`` when every filled cell
    is a number, share, range or missing value (a column of dashes only stays ``txt``);
    otherwise ``txt``, so a prose column reads left-aligned from its header down."""
    n = max([len(table.header), *(len(r) for r in table.rows)], default=0)
    out = []
    for j in range(n):
        cells = [str(r[j]).strip() for r in table.rows if j < len(r)]
        filled = [c for c in cells if c not in ("", "–")]
        out.append("num" if filled and all(align(c) == "num" for c in filled) else "txt")
    return out


def _kind(block: Any) -> str:
    return (
        "table"
        if isinstance(block, Table)
        else "figure"
        if isinstance(block, FigureRef)
        else "text"
    )
