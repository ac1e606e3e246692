"""``vitreg vlm SPEC --images DIR --prompt "..."``: a LLaVA model's answers and language->image
attention maps without and with test-time registers on its vision tower."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.output import cli_errors, console, show_notice, show_path
from vitreg.cli.progress import progress
from vitreg.configs import VlmConfig
from vitreg.report.render.markdown import num, pct


def run_vlm_command(cfg: Any) -> None:
    """The vlm verb on a typed :class:`~vitreg.configs.VlmConfig`, then its summary."""
    from vitreg.verbs import run_vlm

    with cli_errors():
        run = run_vlm(cfg, progress, show_notice)
    show(run.results, run.run_dir)


vlm_command = opt.config_command(
    VlmConfig,
    run_vlm_command,
    """Answer a prompt per image without and with test-time registers on the VLM's vision
    tower; report the language model's attention over the image, the tower's norms and the
    answers.""",
    argument="spec",
)


def show(results: dict[str, Any], run_dir: Path) -> None:
    """The console summary: answers per image, then the means."""
    table = Table(title="vitreg vlm")
    for column in ("image", "answer before", "answer after", "edit dist.", "KL first token"):
        table.add_column(column)
    for i, row in enumerate(results["images"]):
        table.add_row(
            str(i),
            escape(row["before"]["answer"]),
            escape(row["after"]["answer"]),
            str(row["answer_change"]["edit_distance"]),
            num(row["first_token"]["kl"]),
        )
    console.print(table)
    s = results["summary"]
    console.print(
        f"answers identical: {pct(s['identical_rate'])}; attention on outlier patches "
        f"{pct(s['attention_on_outliers_before'])} -> {pct(s['attention_on_outliers_after'])}; "
        f"max/median patch norm {num(s['max_over_median_before'])} -> "
        f"{num(s['max_over_median_after'])}"
    )
    show_path("run directory", run_dir)
