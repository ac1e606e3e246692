"""``vitreg experiment variants --data D``: train, probe and diagnose the ViT variant grid and
write one comparison report (register with ``app.add_typer(experiment_app, name="experiment")``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from vitreg.cli import options as opt
from vitreg.cli.command import VitregCommand, VitregGroup
from vitreg.cli.diagnose_cmd import default_run_dir
from vitreg.cli.output import cli_errors, console, err_console
from vitreg.cli.progress import progress
from vitreg.report.out_dir import check_out

experiment_app = typer.Typer(
    help="Controlled experiments that train several models and compare them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=VitregGroup,
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


@experiment_app.command("variants", cls=VitregCommand)
def variants_command(
    ctx: typer.Context,
    data: str | None = typer.Option(
        None,
        "--data",
        help="Dataset spec or image folder: synthetic:n=256,size=48 (labels, masks, depth: all "
        "probes) or imagefolder:DIR (labels only: classification probe only); required unless "
        "--config gives it.",
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
    figure_format: str | None = opt.FIGURE_FORMAT,
    config: Path | None = opt.CONFIG,
    overwrite: bool = opt.OVERWRITE,
) -> None:
    """Train baseline, +norm/LS and +early-QKV ViTs x {none, registers, attention bias} (and the
    GAP baseline), probe and diagnose each, and write one comparison report."""
    from vitreg.cli.train_cmd import without_none
    from vitreg.configs import ExperimentConfig

    params = dict(locals())
    with cli_errors():
        cfg = opt.resolve_config(ctx, ExperimentConfig, config, without_none(params))
    run_experiment(cfg)


def resolved(cfg: Any) -> Any:
    """``cfg`` with the machine-dependent defaults filled in (size, threads, run directory), so
    that its config.yaml reruns the same experiment elsewhere."""
    import torch

    cpu = not torch.cuda.is_available()
    size = cfg.size or ("tiny" if cpu else "small")
    run_dir = cfg.out if cfg.out is not None else default_run_dir("variants", verb="experiment")
    return cfg.model_copy(
        update={"size": size, "threads": _threads(cfg.threads, size, cpu), "out": run_dir}
    )


def experiment_args(cfg: Any) -> dict[str, Any]:
    """The arguments of :func:`vitreg.experiment.run_variants` (after data and out) that a
    resolved :class:`~vitreg.configs.ExperimentConfig` sets."""
    from vitreg.experiment import grid, preset

    settings = preset(
        cfg.size,
        steps=cfg.steps,
        recipe=cfg.recipe,
        seeds=cfg.seeds,
        batch_size=cfg.batch_size,
    )
    return {
        "settings": settings,
        "variants": grid(include_gap=cfg.include_gap),
        "finetune": cfg.finetune,
        "pretrained": cfg.pretrained,
    }


def command_line(cfg: Any) -> str:
    """The command line that reproduces the run of a resolved ``cfg``."""
    parts = ["vitreg", "experiment", "variants", "--data", cfg.data]
    shown = {k: getattr(cfg, k) for k in ("out", "size", "steps", "recipe", "seeds")}
    shown |= {"batch-size": cfg.batch_size, "threads": cfg.threads}
    parts += [f"--{k}={v}" for k, v in shown.items() if v is not None]
    parts += [] if cfg.include_gap else ["--no-gap"]
    parts += [f"--finetune={cfg.finetune}"] if cfg.finetune else []
    parts += ["--pretrained"] if cfg.pretrained else []
    return shlex.join(parts)


def run_experiment(cfg: Any) -> None:
    """The experiment verb on a typed :class:`~vitreg.configs.ExperimentConfig`."""
    import time

    import torch

    from vitreg.experiment import run_variants

    with cli_errors():
        cfg = resolved(cfg)
        check_out(cfg.out, "experiment", None, cfg.overwrite)
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        t0 = time.perf_counter()
        result = run_variants(
            cfg.data,
            cfg.out,
            **experiment_args(cfg),
            log=lambda msg: err_console.print(escape(msg)),
            progress=progress,
            command=command_line(cfg),
            config=cfg.to_file(),
        )
    console.print(
        f"{len(result.variants)} variants in {time.perf_counter() - t0:.0f} s; report: "
        f"[bold]{escape(str(cfg.out / 'report.md'))}[/bold] (metrics.json, report.html, figures/)"
    )
