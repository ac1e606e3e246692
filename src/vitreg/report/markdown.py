"""The report structure every verb shares (sections of paragraphs, tables and figures), the
sections of the envelope every run has (model, images, provenance), number formatting, and
rendering to Markdown. Each verb's own sections live in ``report/verbs/`` or beside the verb."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vitreg.core.weights import WEIGHT_KINDS
from vitreg.report.schema import is_synthetic


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


def is_random_init(doc: dict[str, Any]) -> bool:
    """Whether the run's model has random, untrained weights: its recorded weight kind, or
    ``--random-init`` in the config of runs written before the kind was recorded."""
    model, config = doc.get("model"), doc.get("config")
    if isinstance(model, dict) and model.get("weights") == "random":
        return True
    return isinstance(config, dict) and bool(config.get("random_init"))


def random_init_banner(name: str) -> str:
    """The banner of a report on a model with random weights (``--random-init``,
    ``pretrained=False``)."""
    return (
        f"**RANDOM WEIGHTS:** `{name}` has random, untrained weights (`--random-init` or "
        "`pretrained=False`); no trained weights were loaded. Artifacts found here, or their absence, say nothing about the trained model; "
        "use this report to check the tool, not to draw conclusions about the model."
    )


def synthetic_banner(doc: dict[str, Any], planted: str = "planted register neurons") -> str | None:
    """The banner of a report on a model that is not a trained ViT: a synthetic one (random
    weights with ``planted`` structure), or one built with ``--random-init``; ``None`` for
    trained weights."""
    model = doc["model"]
    name = model.get("spec") or model.get("class_name") or "model"
    if not is_synthetic(model):
        return random_init_banner(name) if is_random_init(doc) else None
    return (
        f"**SYNTHETIC MODEL:** `{name}` has random weights with {planted}; it is not a trained "
        "ViT. Use this report to check the tool, not to draw conclusions about real models."
    )


def figure_section(title: str, figures: list[Any]) -> Section:
    """A section holding every figure (file and caption) under ``title``."""
    return Section(
        "figures", title, [FigureRef(f"figures/{f.filename}", f.caption) for f in figures]
    )


def model_section(doc: dict[str, Any]) -> Section:
    m = doc["model"]
    lay = m.get("layout", {})
    rows = [
        ["spec", code_span(m["spec"]) if m.get("spec") else "– (wrapped module)"],
        ["family / source", f"{text(m.get('family'))} / {text(m.get('source') or None)}"],
        ["weights", text(WEIGHT_KINDS.get(m.get("weights"), "not recorded"))],
        ["class", code(m.get("class_name"))],
        [
            "token layout",
            f"{lay.get('n_cls', 0)} [CLS], {lay.get('n_reg', 0)} registers, "
            f"{lay.get('n_patches', '?')} patches on a {lay.get('grid')} grid, "
            f"patch size {lay.get('patch_size')}",
        ],
        ["dimensions", ", ".join(f"{k} {num(v)}" for k, v in m.get("dims", {}).items())],
        ["image size", text(m.get("image_size"))],
        ["attention path", text(m.get("attention"))],
    ]
    s = Section("model", "Model", [Table(["", ""], rows)])
    s.blocks += [f"Note: {n}" for n in m.get("notes", [])]
    return s


def data_section(doc: dict[str, Any]) -> Section:
    d = doc["data"]
    s = Section("data", "Images")
    desc = f" (source: {d['description']})" if d.get("description") else ""
    s.blocks.append(f"{d['n_images']} images{desc} were analysed.")
    if d.get("synthetic"):
        s.blocks.append(
            "The images are synthetic (generated textures with flat regions), not photos."
        )
    if d["skipped"]:
        s.blocks.append(f"{len(d['skipped'])} files were skipped:")
        rows = [[code_span(k), escape_text(v)] for k, v in d["skipped"].items()]
        s.blocks.append(Table(["file", "reason"], rows))
    else:
        s.blocks.append("No file was skipped.")
    if d["converted"]:
        s.blocks.append(f"{len(d['converted'])} files were converted to 8-bit RGB:")
        s.blocks.append(
            Table(
                ["file", "original mode"],
                [[code_span(k), escape_text(v)] for k, v in d["converted"].items()],
            )
        )
    return s


def provenance_section(doc: dict[str, Any]) -> Section:
    keys = ("vitreg_version", "torch_version", "timm_version", "transformers_version")
    rows = [
        [k, text(doc.get(k)) if doc.get(k) is not None else "not installed"]
        for k in (*keys, "open_clip_version", "python_version")
    ]
    rows += [["created (UTC)", doc["created"]], ["command", code(doc["command"])]]
    rows += [[f"config: {k}", code(v)] for k, v in doc["config"].items()]
    return Section("provenance", "Provenance", [Table(["", ""], rows)])


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


def _md_block(b: Block) -> list[str]:
    if isinstance(b, Table):
        return markdown_table(b).splitlines()
    if isinstance(b, FigureRef):
        stem = b.filename.rsplit("/", 1)[-1].removesuffix(".png")
        return [f"![{stem}]({b.filename})", "", f"*{b.caption}*"]
    return [b]
