"""Run-directory files shared by every verb that writes them: the metrics.json document with
traceable headlines, the synthetic-model banner, and the write order: config.yaml and
metrics.json first (atomically), then figures, report.md and report.html. A rendering failure
(a bug) so never loses the results: it raises :class:`~vitreg.errors.RenderError`, which names
them and ``vitreg report RUN``, the command that renders the report again from them."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vitreg.core.io import write_json_atomic, write_text_atomic
from vitreg.core.readers import read_json
from vitreg.errors import InputError, RenderError
from vitreg.report.figures import Figure, figure_formats
from vitreg.report.markdown import (
    FigureRef,
    Report,
    Section,
    is_random_init,
    random_init_banner,
    render_markdown,
)
from vitreg.report.schema import (
    SCHEMA_VERSION,
    Metric,
    data_info,
    is_synthetic,
    model_info,
    plain,
    resolve,
    utc_now,
    validate_metrics,
    versions,
)


def document(
    verb: str,
    command: str,
    described: dict[str, Any],
    data: dict[str, Any],
    config: dict[str, Any],
    results: dict[str, Any],
    headlines: list[tuple],
) -> dict[str, Any]:
    """The validated metrics.json document of one ``verb`` run; ``headlines`` are ``(name,
    pointer, higher_is_better, extra)`` with a JSON pointer into the document."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "verb": verb,
        **versions(),
        "created": utc_now(),
        "command": command,
        "model": model_info(described),
        "data": data_info(data),
        "config": plain(config),
        "results": plain(results),
    }
    doc["metrics"] = [
        Metric(
            name=name, value=resolve(doc, pointer), higher_is_better=better, source=pointer, **extra
        ).model_dump(mode="json")
        for name, pointer, better, extra in headlines
    ]
    return validate_metrics(doc).model_dump(mode="json")


# what a rendering writes beside the results
REPORTS = ("report.md", "report.html", "comparison.md")
CAPTIONS = "figures.json"  # in figures/: each figure's name and caption, read by `vitreg report`
SLIDER = (
    "slider.json"  # in figures/: the maps of report.html's block slider, read by `vitreg report`
)
Builder = Callable[[dict[str, Any], list[Figure]], Report]  # a verb's report from doc and figures


def again_command(out: Path) -> str:
    """The command that renders the report of the run in ``out`` again from its results."""
    return shlex.join(["vitreg", "report", str(out)])


def save_document(out: Path, doc: dict[str, Any]) -> Path:
    """config.yaml, then metrics.json, atomically, before anything is rendered; its path."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "config.yaml", yaml.safe_dump(doc["config"], sort_keys=False))
    return write_json_atomic(out / "metrics.json", doc)


@contextmanager
def rendering(out: Path, saved: Path, again: str) -> Iterator[None]:
    """Run the rendering of a report whose results are ``saved``: any failure (a bug) becomes a
    :class:`RenderError` naming them and ``again``, and the report files are removed, so none
    is left that disagrees with the results."""
    try:
        yield
    except Exception as e:
        for name in REPORTS:
            (out / name).unlink(missing_ok=True)
        raise RenderError(str(saved), again, e) from e


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


def save_slider(out: Path, slider: dict[str, Any] | None) -> None:
    """The block slider's maps and images in ``out/figures``, so ``vitreg report`` renders the
    same page again without the analysis."""
    if slider is not None:
        write_json_atomic(out / "figures" / SLIDER, slider)


def saved_slider(out: Path) -> dict[str, Any] | None:
    """The slider a run saved (None: a verb without one, or a run written before it was)."""
    path = out / "figures" / SLIDER
    if not path.is_file():
        return None
    slider = read_json(path, "slider file", allow_nan=True)
    if not isinstance(slider, dict):
        raise InputError(f"{path} holds no slider object; delete it to render without the slider")
    return slider


def write_report(
    out: Path,
    report: Report,
    figures: Sequence[Figure],
    slider: dict | None = None,
    markdown: str = "report.md",
) -> None:
    """Render ``report`` as Markdown and self-contained HTML, then write both files."""
    from vitreg.report.html import render_html

    texts = {markdown: render_markdown(report), "report.html": render_html(report, figures, slider)}
    for name, text in texts.items():
        write_text_atomic(out / name, text)


def write_files(
    out: Path,
    doc: dict[str, Any],
    figures: Callable[[], Sequence[Figure]] | None = None,
    report: Builder | None = None,
) -> Path:
    """The one writer of every verb's run directory: config.yaml and metrics.json first, then
    ``figures()`` and ``report(doc, figures)`` as report.md and report.html; a failure while
    rendering raises :class:`RenderError` with the results saved."""
    saved = save_document(out, doc)
    with rendering(out, saved, again_command(out)):
        drawn = list(figures()) if figures is not None else []
        save_figures(out, drawn, figure_formats(doc["config"]))
        if report is not None:
            write_report(out, report(doc, drawn), drawn)
    return out


def synthetic_banner(doc: dict[str, Any]) -> str | None:
    """The banner of a report on a model that is not a trained ViT: a synthetic (planted) one,
    or one built with ``--random-init``; ``None`` for trained weights."""
    model = doc["model"]
    if not is_synthetic(model):
        return random_init_banner(model.get("spec") or "model") if is_random_init(doc) else None
    return (
        f"**SYNTHETIC MODEL:** `{model.get('spec')}` has random weights with planted register "
        "neurons; it is not a trained ViT. Use this report to check the tool, not to draw "
        "conclusions about real models."
    )


def figure_section(title: str, figures: list[Figure]) -> Section:
    return Section(
        "figures", title, [FigureRef(f"figures/{f.filename}", f.caption) for f in figures]
    )
