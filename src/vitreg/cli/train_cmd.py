"""``vitreg train VARIANT --data D --recipe supervised|dino``: train a ViT, resumable, logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from vitreg.cli import options as opt
from vitreg.cli.output import cli_errors, console, show_notice, show_path
from vitreg.cli.progress import progress


def train_command(
    ctx: typer.Context,
    variant: str | None = typer.Argument(
        None,
        help="timm ViT name (e.g. vit_tiny_patch16_224) or vitreg variant (vitreg_*); "
        "required unless --config gives it.",
    ),
    data: str | None = typer.Option(
        None,
        "--data",
        help="Dataset spec: imagefolder:DIR, synthetic-cls:n=64,size=32, ... (required unless "
        "--config gives it).",
    ),
    recipe: str = typer.Option("supervised", "--recipe", help="supervised (DeiT III) or dino."),
    out: Path | None = typer.Option(
        None, "--out", help="Run directory (default runs/<time>_<model>_train)."
    ),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Optimizer steps."),
    epochs: float | None = typer.Option(None, "--epochs", help="Epochs (instead of --steps)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Global batch per step."),
    lr: float | None = typer.Option(None, "--lr", help="Peak learning rate (default scaled)."),
    img_size: int | None = typer.Option(None, "--img-size", min=1, help="Input size in pixels."),
    accum_steps: int = typer.Option(1, "--accum-steps", min=1, help="Gradient accumulation."),
    amp: str = typer.Option(
        "auto", "--amp", help="auto (bf16/fp16 on CUDA, off on CPU), off, bf16, fp16."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for init, data order and augmentations."),
    checkpoint_every: int | None = typer.Option(
        None, "--checkpoint-every", min=1, help="Steps between checkpoints (and at the end)."
    ),
    resume: bool = typer.Option(
        True, "--resume/--no-resume", help="Continue from the newest checkpoint in --out."
    ),
    extend: bool = typer.Option(
        False,
        "--extend",
        help="Resume with a larger --steps: continue the run on a schedule stretched to the new "
        "total (without it, another total is refused).",
    ),
    device: str | None = typer.Option(None, "--device", help="torch device, e.g. cpu or cuda:0."),
    model_arg: list[str] | None = typer.Option(
        None, "--model-arg", help="Model constructor argument KEY=VALUE (repeatable), e.g. depth=2."
    ),
    option: list[str] | None = typer.Option(
        None, "--option", help="Recipe option KEY=VALUE (repeatable), e.g. n_local_crops=2."
    ),
    config: Path | None = opt.CONFIG,
    overwrite: bool = opt.OVERWRITE,
) -> None:
    """Train a ViT (supervised DeiT-III or DINO/iBOT); run under torchrun for data parallelism."""
    from vitreg.configs import TrainRunConfig

    params = dict(locals())
    with cli_errors():
        cfg = opt.resolve_config(ctx, TrainRunConfig, config, without_none(params))
    run_train(cfg)


def without_none(params: dict[str, Any]) -> dict[str, Any]:
    """The command's options without those left unset (``None``), so that a required setting
    neither given nor in ``--config`` is reported as missing, by name."""
    return {k: v for k, v in params.items() if v is not None}


def run_train(cfg: Any) -> None:
    """The train verb on a typed :class:`~vitreg.configs.TrainRunConfig`, then its summary."""
    from vitreg.verbs import run_train as train

    with cli_errors():
        run = train(cfg, progress, show_notice)
    if run.document is None:  # under torchrun only rank 0 writes and prints
        return
    result = run.training
    last = result.history[-1] if result.history else {}
    console.print(
        f"{cfg.recipe}: {result.steps} steps, final loss {last.get('loss', float('nan')):.4f}"
    )
    show_path(
        "run directory",
        run.run_dir,
        " (report.md, report.html, figures/, log.jsonl, model.safetensors, metrics.json)",
    )
