"""``vitreg vlm SPEC --images DIR --prompt "..."``: a LLaVA model's answers and language->image
attention maps without and with test-time registers on its vision tower."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.diagnose_cmd import _command, default_run_dir, slug
from vitreg.cli.fix_cmd import load_neurons
from vitreg.cli.neurons_cmd import find_neurons, image_source, load_model
from vitreg.cli.output import cli_errors, console, is_main
from vitreg.cli.progress import progress
from vitreg.report.markdown import num, pct
from vitreg.report.out_dir import check_out


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
    """The vlm verb on a typed :class:`~vitreg.configs.VlmConfig`."""
    from vitreg.fix import TestTimeRegisters
    from vitreg.report.figures import display_images
    from vitreg.report.vlm_report import write_vlm_run
    from vitreg.vlm import run_vlm

    spec = cfg.spec
    with cli_errors():
        run_dir = cfg.out if cfg.out is not None else default_run_dir(slug(spec), verb="vlm")
        cfg = cfg.model_copy(update={"out": run_dir})
        check_out(run_dir, "vlm", spec, cfg.overwrite)  # before any model loads
        command = _command(spec, {k: v for k, v in cfg.model_dump().items() if k != "spec"}, "vlm")
        model = load_model(spec, cfg.random_init, None, cfg.device)
        opts = {
            "images": cfg.images,
            "samples": cfg.samples,
            "limit": cfg.limit,
            "batch_size": cfg.batch_size,
        }
        source = image_source(model, spec, opts, keep=cfg.limit or 64)
        chosen, info = choose_neurons(model, spec, source, cfg)
        ttr = TestTimeRegisters(
            chosen, n_registers=cfg.registers, cls=cfg.cls, patches=cfg.patches, mode=cfg.mode
        )
        with progress(source.total, "answering without, then with the fix") as update:
            result = run_vlm(
                model,
                source,
                cfg.prompt,
                ttr,
                max_new_tokens=cfg.max_new_tokens,
                query=cfg.query,
                batch_size=cfg.batch_size,
                progress=update,
            )
        results = {**result.to_dict(), "neurons": info}
        first = result.images[0]
        layer_maps = {
            "before": first.before.layer_grids.numpy(),
            "after": first.after.layer_grids.numpy(),
        }
        if is_main():
            with progress(None, "writing the report"):
                write_vlm_run(
                    run_dir,
                    results,
                    {**model.describe(), "vlm": describe_vlm(model)},
                    source.description(),
                    cfg.to_file(),
                    command,
                    images=display_images(source.display_images()),
                    layer_maps=layer_maps,
                )
    show(results, run_dir)


def choose_neurons(model: Any, spec: str, source: Any, cfg: Any) -> tuple[Any, dict[str, Any]]:
    """The NeuronSet of ``--neurons``: the file, or (auto) discovered on these images first."""
    if cfg.neurons != "auto":
        chosen, info, _ = load_neurons(model, spec, cfg.neurons, source, cfg)
        return chosen, info
    from vitreg.neurons.auto import layer_counts

    console.print(
        "[yellow]--neurons auto: discovering the tower's register neurons on these images first "
        "(as `vitreg neurons` does); the answers are then compared on the same images.[/yellow]"
    )
    chosen = find_neurons(model, source, cfg).chosen
    chosen.check_applicable(model)
    return chosen, {
        "source": "discovered on these images by this run (3 of every 4; the causal check and "
        "top-k on the 4th)",
        "n_neurons": len(chosen),
        "layers": layer_counts(chosen),
    }


def describe_vlm(model: Any) -> dict[str, Any]:
    """The VLM around the tower: class, language-model depth, feature layer and strategy."""
    vlm = model.vlm
    return {
        "class": type(vlm.module).__name__,
        "language_model_layers": len(vlm.lm_layers),
        "language_model_attention": vlm.lm_attention,
        "vision_feature_layer": vlm.feature_layer,
        "vision_feature_select_strategy": vlm.strategy,
        "n_params": sum(p.numel() for p in vlm.module.parameters()),
    }


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
    console.print(f"run directory: [bold]{escape(str(run_dir))}[/bold]")
