"""``vitreg vlm SPEC --images DIR --prompt "..."``: a LLaVA model's answers and language->image
attention maps without and with test-time registers on its vision tower."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.output import cli_errors, console, show_notice, show_path
from vitreg.cli.progress import progress
from vitreg.report.markdown import num, pct


def vlm_command(
    ctx: typer.Context,
    spec: str | None = typer.Argument(
        None, help="VLM spec: hf-vlm:ORG/NAME (e.g. hf-vlm:llava-hf/llava-1.5-7b-hf) or hf-vlm:DIR."
    ),
    prompt: str | None = typer.Option(
        None, "--prompt", help="The question asked about each image."
    ),
    images: Path | None = opt.IMAGES,
    samples: bool = opt.SAMPLES,
    neurons: str = typer.Option(
        "auto",
        "--neurons",
        help="NeuronSet file (neurons.json from `vitreg neurons`) or 'auto': discover the "
        "tower's register neurons on these images first.",
    ),
    query: str = typer.Option(
        "answer",
        "--query",
        help="Text rows whose attention is mapped: answer (the rows that generated the answer) "
        "or last (the last prompt token).",
    ),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", min=1, help="Answer length cap."),
    registers: int = typer.Option(1, "--registers", min=1, help="Test-time registers to insert."),
    cls: str = typer.Option("zero", "--cls", help="Register neurons on [CLS]: zero or keep."),
    patches: str = typer.Option(
        "zero", "--patches", help="Register neurons on patches: zero, mean or keep."
    ),
    mode: str = typer.Option(
        "paper", "--mode", help="paper (Algorithm 2) or reference (the official code's edit)."
    ),
    target: float = typer.Option(
        0.01, "--target", min=0.0, max=1.0, help="Outlier rate for top-k when discovering."
    ),
    limit: int | None = opt.LIMIT,
    batch_size: int = typer.Option(8, "--batch-size", min=1, help="Images per tower pass."),
    random_init: bool = opt.RANDOM_INIT,
    device: str | None = opt.DEVICE,
    out: Path | None = opt.out_dir("vlm"),
    config: Path | None = opt.CONFIG,
    overwrite: bool = opt.OVERWRITE,
) -> None:
    """Answer a prompt per image without and with test-time registers on the VLM's vision tower;
    report the language model's attention over the image, the tower's norms and the answers."""
    from vitreg.configs import VlmConfig

    with cli_errors():
        cfg = opt.resolve_config(ctx, VlmConfig, config, dict(locals()))
    run_vlm_command(cfg)


def run_vlm_command(cfg: Any) -> None:
    """The vlm verb on a typed :class:`~vitreg.configs.VlmConfig`, then its summary."""
    from vitreg.verbs import run_vlm

    with cli_errors():
        run = run_vlm(cfg, progress, show_notice)
    show(run.results, run.run_dir)


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
