"""The one writer of every folder vitreg writes a report into: a run's metrics.json, or a
comparison's comparison.json, with config.yaml, figures/ and the report as Markdown and
self-contained HTML.

Every file is written atomically and the document last: the figures are drawn and the pages
rendered first, so a folder with its document holds the whole run. A run's document comes typed
(the verb's document model, validated once when it was built); the writer hands it to the
renderer as it is and turns it into JSON once, for the file. A failure while drawing or
rendering (a bug) still saves the document, removes the pages (none is left that disagrees with
the results) and raises :class:`~vitreg.errors.RenderError`, which names it and
``vitreg report RUN``, the command that renders the report again from the saved files.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, JsonValue, ValidationError

from vitreg.core.io import write_json_atomic, write_text_atomic
from vitreg.core.readers import read_json
from vitreg.errors import InputError, RenderError, WriteError
from vitreg.report.render.markdown import Report, render_markdown
from vitreg.report.render.plots import Figure, figure_formats
from vitreg.report.slider import Slider

CAPTIONS = "figures.json"  # in figures/: each figure's name and caption, read by `vitreg report`
SLIDER = "slider.json"  # in figures/: the maps of report.html's block slider
#: what a folder's document is given as: a typed document (a run's metrics.json, a leaderboard),
#: or a comparison's plain comparison.json
Document = BaseModel | dict[str, Any]
Sections = Callable[[Any, list[Figure]], Report]  # a verb's report of its document and figures


@dataclass(frozen=True)
class Layout:
    """The file names of one kind of folder: its document, its Markdown page, and whether
    config.yaml (the document's ``config``, to rerun it with ``--config``) sits beside them."""

    document: str
    markdown: str
    config_yaml: bool = True

    @property
    def pages(self) -> tuple[str, str]:
        return (self.markdown, "report.html")


RUN = Layout("metrics.json", "report.md")  # one verb's run
MODELS = Layout("comparison.json", "comparison.md")  # diagnose --models
COMPARE = Layout("comparison.json", "comparison.md", config_yaml=False)  # vitreg compare
BOARD = Layout("leaderboard.json", "leaderboard.md", config_yaml=False)  # vitreg fix --method


def again_command(out: Path) -> str:
    """The command that renders the report of the folder ``out`` again from its saved files."""
    return shlex.join(["vitreg", "report", str(out)])


def save_figures(out: Path, figures: Sequence[Figure], formats: Sequence[str] = ()) -> None:
    """Each figure in ``out/figures`` (PNG and ``formats``) and their captions beside them."""
    for fig in figures:
        fig.save(out / "figures", formats)
    if figures:
        captions = [{"name": f.name, "caption": f.caption} for f in figures]
        write_json_atomic(out / "figures" / CAPTIONS, captions)


def saved_figures(out: Path) -> list[Figure]:
    """The figures a run saved in ``out/figures`` with their captions (a run written before
    captions were saved: each PNG, its name as caption); only files inside that folder."""
    folder = out / "figures"
    index = folder / CAPTIONS
    if index.is_file():
        listed = [(str(f["name"]), str(f["caption"])) for f in json.loads(index.read_text())]
    else:
        listed = [(p.stem, p.stem) for p in sorted(folder.glob("*.png"))]
    pngs = {name: folder / f"{name}.png" for name, _ in listed if Path(name).name == name}
    return [
        Figure(n, c, pngs[n].read_bytes()) for n, c in listed if n in pngs and pngs[n].is_file()
    ]


def saved_slider(out: Path) -> Slider | None:
    """The block slider a run saved (None: a verb without one, or a run written before it was)."""
    path = out / "figures" / SLIDER
    if not path.is_file():
        return None
    slider = read_json(path, "slider file", allow_nan=True)
    try:
        return Slider.model_validate(slider)
    except ValidationError:
        raise InputError(
            f"{path} holds no slider object; delete it to render without the slider"
        ) from None


def pages(
    report: Report, figures: Sequence[Figure], slider: Slider | None, layout: Layout = RUN
) -> dict[str, str]:
    """The Markdown and HTML pages of ``report``, by file name."""
    from vitreg.report.render.html import render_html

    markdown, html = layout.pages
    shown = None if slider is None else slider.model_dump()  # non-finite numbers kept as saved
    return {markdown: render_markdown(report), html: render_html(report, list(figures), shown)}


def write_run(
    run_dir: str | Path,
    doc: Document,
    sections: Sections | None = None,
    figures: Callable[[], Sequence[Figure]] | None = None,
    extras: Callable[[Sequence[Figure]], Slider | None] | None = None,
    layout: Layout = RUN,
) -> dict[str, JsonValue]:
    """Write the folder of ``doc``: config.yaml, ``figures()`` in figures/, ``extras(figures)``
    (the block slider, saved as figures/slider.json and shown in the HTML), the report
    ``sections(doc, figures)`` (``doc`` as given: typed) as Markdown and HTML, and the document
    last; the JSON document written. A failure while drawing or rendering raises
    :class:`RenderError` with the document saved."""
    import yaml

    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = as_json(doc)
    if layout.config_yaml:
        write_text_atomic(out / "config.yaml", yaml.safe_dump(data["config"], sort_keys=False))
    document = out / layout.document
    try:
        drawn = list(figures()) if figures is not None else []
        config = data.get("config")
        chosen = config.get("figure_format") if isinstance(config, dict) else None
        save_figures(out, drawn, figure_formats(chosen))
        slider = extras(drawn) if extras is not None else None
        if slider is not None:
            write_json_atomic(out / "figures" / SLIDER, slider.model_dump())
        texts = pages(sections(doc, drawn), drawn, slider, layout) if sections else {}
    except WriteError:
        raise  # a failing disk is named as such, not as a rendering bug
    except Exception as e:
        for name in layout.pages:
            (out / name).unlink(missing_ok=True)
        raise RenderError(str(write_json_atomic(document, data)), again_command(out), e) from e
    for name, text in texts.items():
        write_text_atomic(out / name, text)
    write_json_atomic(document, data)
    return data


def as_json(doc: Document) -> dict[str, JsonValue]:
    """``doc`` as the JSON object its file holds (a typed document dumped, a plain one as is)."""
    return doc.model_dump(mode="json") if isinstance(doc, BaseModel) else doc


def render_again(
    folder: Path,
    draw: Callable[[list[Figure]], tuple[Report, list[Figure]]],
    layout: Layout = RUN,
) -> list[Path]:
    """The pages of ``folder`` rendered again from its saved files: ``draw(saved figures)``
    gives the report and its figures (the saved ones, or curves a comparison draws again,
    then saved), shown with the saved block slider; the files written. A failure raises
    :class:`RenderError`, the document untouched."""
    try:
        saved = saved_figures(folder)
        report, figures = draw(saved)
        if figures is not saved:
            save_figures(folder, figures)
        texts = pages(report, figures, saved_slider(folder), layout)
    except WriteError:
        raise  # a failing disk is named as such, not as a rendering bug
    except Exception as e:
        for name in layout.pages:
            (folder / name).unlink(missing_ok=True)
        raise RenderError(str(folder / layout.document), again_command(folder), e) from e
    for name, text in texts.items():
        write_text_atomic(folder / name, text)
    return [folder / name for name in layout.pages]
