"""The fix leaderboard's folder, written by the one writer: ``leaderboard.json`` (the board and
what produced it, typed by :class:`~vitreg.results.leaderboard.BoardDocument`),
``leaderboard.md`` and ``report.html`` (one table, its columns explained) and
``figures/fix_leaderboard.png`` (max/median patch norm per block after each fix)."""

from __future__ import annotations

import json
from pathlib import Path

from vitreg.core.renamed import renamed
from vitreg.report.render.markdown import (
    Report,
    Section,
    Table,
    code_span,
    escape_text,
    figure_section,
    num,
)
from vitreg.report.render.plots import Figure, figure, new_canvas, outside_legend
from vitreg.report.writer import BOARD, write_run
from vitreg.results.fix import ComposedDescription, Cosine, FixDescription
from vitreg.results.leaderboard import BoardDocument, BoardResults
from vitreg.results.probe import ProbeScore

COLUMNS = (
    ("fix", "the entry (`a+b`: a composition; its parts get rows of their own)"),
    ("blocks with outlier mode", "blocks whose patch norms still have a separate outlier mode"),
    ("worst max/median", "largest max/median patch norm over the blocks (1 = no outlier)"),
    ("last block max/median", "the same at the last block, the features dense heads read"),
    ("pooled cos", "cosine of the pooled embedding ([CLS]) to the unfixed model, mean"),
    ("patch cos", "cosine of each final patch feature to the unfixed model: mean (min)"),
    ("images/s", "throughput of the forward pass with the fix on"),
    ("x unfixed", "throughput relative to the unfixed model (1 = no cost)"),
)


def _cos(stats: Cosine | None, with_min: bool = False) -> str:
    if stats is None:
        return "–"
    return num(stats.mean) + (f" ({num(stats.min)})" if with_min else "")


def _score(s: ProbeScore) -> str:
    return num(s.mean) + (f" ± {num(s.ci95)}" if s.ci95 is not None else "")


def _parts(fix: FixDescription | None) -> list[FixDescription]:
    """A composition's parts, else the fix itself (none for a refused entry)."""
    if fix is None:
        return []
    return list(fix.parts) if isinstance(fix, ComposedDescription) else [fix]


def _settings(fix: FixDescription) -> str:
    """One fix's description as compact JSON (what it was run with)."""
    return json.dumps(fix.model_dump(mode="json"), separators=(", ", ": "))


def board_table(board: BoardResults, reasons: bool = True) -> Table:
    """One row per entry; refused entries say why in the mode column (``reasons``) or only
    that they were refused (the console's narrow table)."""
    metrics = sorted({m for r in board.rows for m in r.scores})
    header = [c for c, _ in COLUMNS] + metrics
    rows = []
    for r in board.rows:
        name = code_span(r.entry)
        if r.refused:
            why = "refused: " + escape_text(r.refused) if reasons else "refused (see report)"
            rows.append([name, why] + ["–"] * (len(header) - 2))
            continue
        rows.append(
            [
                name,
                ", ".join(map(str, r.blocks_with_mode)) or "none",
                num(r.residual_max_over_median),
                num(r.last_block_max_over_median),
                _cos(r.pooled_cosine),
                _cos(r.patch_cosine, with_min=True),
                num(r.images_per_s),
                num(r.relative_speed),
                *(_score(r.scores[m]) if m in r.scores else "–" for m in metrics),
            ]
        )
    return Table(header, rows)


def report(d: BoardDocument, figures: list[Figure]) -> Report:
    """leaderboard.md of the typed leaderboard ``d``: what ran, the table, its columns, what
    each composition's parts did, each entry's settings and the figure."""
    board = d.board
    banner = (
        f"**SYNTHETIC MODEL:** {code_span(d.model)} has random weights with planted "
        "register neurons; use this table to check the tool, not to rank methods."
        if d.synthetic
        else None
    )
    table = Section("board", "Leaderboard")
    table.blocks += [
        f"{board.n_images} images ({escape_text(d.data.description)}); command: "
        f"{code_span(d.command)}",
        board_table(board),
    ]
    columns = [f"- **{c}**: {what}" for c, what in COLUMNS]
    columns.append(
        "- probe columns (when asked for): score mean ± 95% interval over the probe seeds"
    )
    sections = [table, Section("columns", "Columns", ["\n".join(columns)])]
    composed = [
        f"- {code_span(r.entry)} applies "
        + " then ".join(code_span(p.name) for p in r.fix.parts)
        + "; each part's own row shows what it does alone."
        for r in board.rows
        if isinstance(r.fix, ComposedDescription)
    ]
    if composed:
        sections.append(Section("compositions", "Compositions", ["\n".join(composed)]))
    settings = [
        f"- {code_span(r.entry)}: {code_span(_settings(part))}"
        for r in board.rows
        for part in _parts(r.fix)
    ]
    sections.append(Section("settings", "Settings", ["\n".join(settings) or "–"]))
    if board.protocol is not None:
        sections.append(protocol_section(board))
    sections.append(figure_section("Figures", figures))
    return Report(banner, f"Fix leaderboard: {code_span(d.model)}", sections)


def protocol_section(board: BoardResults) -> Section:
    """Each scored row's ov-seg settings and where they are published (``--protocol``)."""
    from vitreg.probe.protocols import protocol_note

    lines = [
        f"- {code_span(r.entry)}: {escape_text(protocol_note(r.protocol))}"
        for r in board.rows
        if r.protocol is not None
    ]
    intro = (
        f"ov-seg scores under `--protocol {board.protocol}`: each method with its own "
        "repository's settings for the benchmark, so its row reads against the paper's table."
    )
    return Section("protocol", "Protocol", [intro, "\n".join(lines) or "–"])


def board_figure(board: BoardResults) -> Figure:
    """Max/median patch norm per block, one line per entry (log scale)."""
    fig = new_canvas(7.0, 3.6)
    fig.subplots_adjust(right=0.72)
    ax = fig.subplots()
    for i, r in enumerate(x for x in board.rows if not x.refused):
        style = "--" if r.entry == "none" else "-"
        ax.plot(r.max_over_median, style, marker="o", ms=3, color=f"C{i % 10}", label=r.entry)
    ax.set_yscale("log")
    ax.set_xlabel("block")
    ax.set_ylabel("max / median patch norm")
    outside_legend(ax)
    caption = (
        "Max over median patch-token norm at each block's output (`hook_resid_post`) after each "
        "fix; the dashed line is the unfixed model. 1 means no token stands out."
    )
    return figure("fix_leaderboard", caption, fig)


def write_leaderboard(out: Path, doc: BoardDocument) -> BoardDocument:
    """Write the leaderboard folder of ``doc`` (typed once, where it was made) through the one
    writer; ``doc`` returned."""
    write_run(out, doc, report, lambda: [board_figure(doc.board)], layout=BOARD)
    return doc


__getattr__ = renamed(__name__, {"write_board": "write_leaderboard"}, globals())
