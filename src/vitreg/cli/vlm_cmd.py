"""``vitreg vlm SPEC --images DIR --prompt "..."``: a LLaVA model's answers and language->image
attention maps without and with test-time registers on its vision tower."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from vitreg.cli.output import console, show_path

if TYPE_CHECKING:
    from vitreg.verbs.vlm import VlmResults


def show_run(run: Any, cfg: Any) -> None:
    """The summary of a vlm run."""
    show(run.results, run.run_dir)


def show(results: VlmResults, run_dir: Path) -> None:
    """The console summary: answers per image, then the means."""
    from vitreg.verbs.display import num, pct

    table = Table(title="vitreg vlm")
    for column in ("image", "answer before", "answer after", "edit dist.", "KL first token"):
        table.add_column(column)
    for i, row in enumerate(results.images):
        table.add_row(
            str(i),
            escape(row.before.answer),
            escape(row.after.answer),
            str(row.answer_change.edit_distance),
            num(row.first_token.kl),
        )
    console.print(table)
    s = results.summary
    console.print(
        f"answers identical: {pct(s.identical_rate)}; attention on outlier patches "
        f"{pct(s.attention_on_outliers_before)} -> {pct(s.attention_on_outliers_after)}; "
        f"max/median patch norm {num(s.max_over_median_before)} -> "
        f"{num(s.max_over_median_after)}"
    )
    tax = results.taxonomy
    for before, after in tax.pairs() if tax is not None else []:
        part = before or after
        counts = ["–" if p is None else f"{p.sink} / {p.dead} / {p.alive}" for p in (before, after)]
        console.print(
            f"{part.site if part else '?'}: sink / dead / alive {counts[0]} -> {counts[1]} "
            f"(alive {pct(before and before.alive_share)} -> {pct(after and after.alive_share)})"
        )
    show_path("run directory", run_dir)
