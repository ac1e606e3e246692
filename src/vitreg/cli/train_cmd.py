"""``vitreg train VARIANT --data D --recipe supervised|dino``: train a ViT, resumable, logged."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from vitreg.cli import options as opt
from vitreg.cli.diagnose_cmd import _command, default_run_dir, slug
from vitreg.cli.output import cli_errors, console, fail
from vitreg.cli.progress import progress
from vitreg.progress import step_phase
from vitreg.report.out_dir import check_out


def parse_pairs(pairs: list[str] | None) -> dict[str, Any]:
    """``["depth=2", "mask_ratio=[0.1,0.5]"]`` -> ``{"depth": 2, "mask_ratio": [0.1, 0.5]}``
    (values are JSON where they parse, else strings; the config has checked the KEY=VALUE form)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, _, raw = pair.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


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


def train_args(cfg: Any) -> dict[str, Any]:
    """The keyword arguments of :func:`vitreg.train.train` (after variant, data, recipe and the
    run directory) that a :class:`~vitreg.configs.TrainRunConfig` sets."""
    names = ("steps", "epochs", "batch_size", "lr", "accum_steps", "amp", "seed")
    names += ("checkpoint_every", "resume", "extend", "img_size", "device")
    return {
        **{k: getattr(cfg, k) for k in names},
        "model_kwargs": parse_pairs(cfg.model_arg),
        "options": parse_pairs(cfg.option),
    }


def run_train(cfg: Any) -> None:
    """The train verb on a typed :class:`~vitreg.configs.TrainRunConfig`."""
    if cfg.out is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise fail("under torchrun pass --out DIR, so that every rank uses the same run directory")
    from vitreg.train import train

    run_dir = cfg.out if cfg.out is not None else default_run_dir(slug(cfg.variant), verb="train")
    cfg = cfg.model_copy(update={"out": run_dir})
    with cli_errors():
        check_out(run_dir, "train", cfg.variant, cfg.overwrite)
    with cli_errors(), step_phase(progress, "training (optimizer steps)") as steps:  # rank 0 only
        result = train(
            cfg.variant, cfg.data, cfg.recipe, run_dir, progress=steps, **train_args(cfg)
        )
    if int(os.environ.get("RANK", "0")) != 0:
        return
    with cli_errors():
        write_result(run_dir, result, cfg)
    if result.resumed_from is not None:
        console.print(f"resumed from the checkpoint at step {result.resumed_from}")
    last = result.history[-1] if result.history else {}
    console.print(
        f"{cfg.recipe}: {result.steps} steps, final loss {last.get('loss', float('nan')):.4f}; "
        f"run directory: [bold]{escape(str(run_dir))}[/bold] (log.jsonl, model.safetensors, "
        "metrics.json)"
    )


def command_line(cfg: Any) -> str:
    """The command line that reproduces the run of ``cfg`` (repeatable options repeated)."""
    values = cfg.model_dump(exclude={"variant", "model_arg", "option", "resume"})
    parts = shlex.split(_command(cfg.variant, values, verb="train"))
    parts += [] if cfg.resume else ["--no-resume"]
    for flag, pairs in (("--model-arg", cfg.model_arg), ("--option", cfg.option)):
        parts += [x for pair in pairs or [] for x in (flag, pair)]
    return shlex.join(parts)


def write_result(run_dir: Path, result: Any, cfg: Any) -> None:
    """The run's result document (config.yaml, metrics.json), with the data it trained on."""
    from vitreg.report.train_report import write_train_run
    from vitreg.train.data import describe_training_data

    write_train_run(
        run_dir,
        result,
        spec=cfg.variant,
        data=describe_training_data(cfg.data, recipe=cfg.recipe),
        config=cfg.to_file(),
        command=command_line(cfg),
    )
