"""``vitreg experiment variants --data D``: train, probe and diagnose the ViT variant grid and
write one comparison report (register with ``app.add_typer(experiment_app, name="experiment")``)."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer
from rich.markup import escape

from vitreg.cli.diagnose_cmd import default_run_dir
from vitreg.cli.output import cli_errors, console, err_console, fail

experiment_app = typer.Typer(
    help="Controlled experiments that train several models and compare them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@experiment_app.callback()
def experiment() -> None:
    """Controlled experiments that train several models and compare them."""


def _threads(threads: int | None, size: str, device_is_cpu: bool) -> int | None:
    """Torch threads: 1 for the tiny preset on CPU (its small ops do not scale; measured 2-4x
    faster on a 2-core machine), else the given count or torch's default."""
    if threads is not None:
        return threads
    return 1 if size == "tiny" and device_is_cpu else None


@experiment_app.command("variants")
def variants_command(
    data: str = typer.Option(
        ...,
        "--data",
        help="Dataset spec or image folder: synthetic:n=256,size=48 (labels, masks, depth: all "
        "probes) or imagefolder:DIR (labels only: classification probe only).",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Experiment folder (default runs/<time>_variants_experiment)."
    ),
    size: str | None = typer.Option(
        None, "--size", help="tiny (default on CPU, ~1 min per variant) or small (default on GPU)."
    ),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Training steps per variant."),
    recipe: str = typer.Option(
        "dino", "--recipe", help="dino (default: the dense iBOT loss the gains need) or supervised."
    ),
    include_gap: bool = typer.Option(
        True, "--include-gap/--no-gap", help="Add the GAP baseline (average pooling, no [CLS])."
    ),
    finetune: str | None = typer.Option(
        None,
        "--finetune",
        help="Also fine-tune this timm ViT as is and converted to +early QKV (random init "
        "unless --pretrained).",
    ),
    pretrained: bool = typer.Option(
        False, "--pretrained", help="Load --finetune's timm weights (needs them cached or online)."
    ),
    seeds: int | None = typer.Option(
        None, "--seeds", min=1, help="Training seeds per variant (default 1; 3 measures noise)."
    ),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help="Global batch."),
    threads: int | None = typer.Option(
        None, "--threads", min=1, help="torch CPU threads (default: 1 for tiny on CPU)."
    ),
) -> None:
    """Train baseline, +norm/LS and +early-QKV ViTs x {none, registers, attention bias} (and the
    GAP baseline), probe and diagnose each, and write one comparison report."""
    import time

    import torch

    from vitreg.experiment import grid, preset, run_variants

    if finetune is None and pretrained:
        raise fail("--pretrained applies to --finetune NAME; pass both or neither")
    size = size or ("small" if torch.cuda.is_available() else "tiny")
    n_threads = _threads(threads, size, not torch.cuda.is_available())
    if n_threads is not None:
        torch.set_num_threads(n_threads)
    shown = {"out": out, "size": size, "steps": steps, "recipe": recipe, "seeds": seeds}
    with cli_errors():
        settings = preset(size, steps=steps, recipe=recipe, seeds=seeds, batch_size=batch_size)
        run_dir = out if out is not None else default_run_dir("variants", verb="experiment")
        shown["out"] = run_dir
        parts = ["vitreg", "experiment", "variants", "--data", data]
        parts += [f"--{k}={v}" for k, v in shown.items() if v is not None]
        parts += [] if include_gap else ["--no-gap"]
        parts += [f"--finetune={finetune}"] if finetune else []
        parts += ["--pretrained"] if pretrained else []
        t0 = time.perf_counter()
        result = run_variants(
            data,
            run_dir,
            settings,
            variants=grid(include_gap=include_gap),
            finetune=finetune,
            pretrained=pretrained,
            log=lambda msg: err_console.print(escape(msg)),
            command=shlex.join(parts),
        )
    console.print(
        f"{len(result.variants)} variants in {time.perf_counter() - t0:.0f} s; report: "
        f"[bold]{escape(str(run_dir / 'report.md'))}[/bold] (metrics.json, report.html, figures/)"
    )
