"""``vitreg train VARIANT --data D --recipe supervised|dino``: train a ViT, resumable, logged."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from vitreg.cli.diagnose_cmd import _command, default_run_dir, slug
from vitreg.cli.output import cli_errors, console, fail


def parse_pairs(pairs: list[str] | None, flag: str) -> dict[str, Any]:
    """``["depth=2", "mask_ratio=[0.1,0.5]"]`` -> ``{"depth": 2, "mask_ratio": [0.1, 0.5]}``."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise fail(f"{flag} takes KEY=VALUE (e.g. {flag} depth=2), got {pair!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


class ProgressBar:
    """A tqdm bar on stderr, opened at the first step (errors before training print alone)."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, step: int, total: int, record: dict[str, Any]) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=step - 1, unit="step")
        self.bar.update(step - self.bar.n)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def train_command(
    variant: str = typer.Argument(
        ..., help="timm ViT name (e.g. vit_tiny_patch16_224) or vitreg variant (vitreg_*)."
    ),
    data: str = typer.Option(
        ..., "--data", help="Dataset spec: imagefolder:DIR, synthetic-cls:n=64,size=32, ..."
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
    device: str | None = typer.Option(None, "--device", help="torch device, e.g. cpu or cuda:0."),
    model_arg: list[str] | None = typer.Option(
        None, "--model-arg", help="Model constructor argument KEY=VALUE (repeatable), e.g. depth=2."
    ),
    option: list[str] | None = typer.Option(
        None, "--option", help="Recipe option KEY=VALUE (repeatable), e.g. n_local_crops=2."
    ),
) -> None:
    """Train a ViT (supervised DeiT-III or DINO/iBOT); run under torchrun for data parallelism."""
    if steps is None and epochs is None:
        raise fail("pass --steps N or --epochs E")
    if out is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise fail("under torchrun pass --out DIR, so that every rank uses the same run directory")
    model_kwargs = parse_pairs(model_arg, "--model-arg")
    options = parse_pairs(option, "--option")
    from vitreg.train import train

    run_dir = out if out is not None else default_run_dir(slug(variant), verb="train")
    bar = ProgressBar()  # train() reports progress on rank 0 only
    with cli_errors():
        try:
            result = train(
                variant,
                data,
                recipe,
                run_dir,
                steps=steps,
                epochs=epochs,
                batch_size=batch_size,
                lr=lr,
                accum_steps=accum_steps,
                amp=amp,
                seed=seed,
                checkpoint_every=checkpoint_every,
                resume=resume,
                progress=bar,
                img_size=img_size,
                model_kwargs=model_kwargs,
                options=options,
                device=device,
            )
        finally:
            bar.close()
    if int(os.environ.get("RANK", "0")) != 0:
        return
    shown = {
        "data": data,
        "recipe": recipe,
        "out": str(run_dir),
        "steps": steps,
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "img_size": img_size,
        "accum_steps": accum_steps,
        "amp": amp,
        "seed": seed,
        "checkpoint_every": checkpoint_every,
        "device": device,
        "model_arg": model_kwargs or None,
        "option": options or None,
    }
    with cli_errors():
        write_result(run_dir, result, variant, shown)
    if result.resumed_from is not None:
        console.print(f"resumed from the checkpoint at step {result.resumed_from}")
    last = result.history[-1] if result.history else {}
    console.print(
        f"{recipe}: {result.steps} steps, final loss {last.get('loss', float('nan')):.4f}; "
        f"run directory: [bold]{escape(str(run_dir))}[/bold] (log.jsonl, model.safetensors, "
        "metrics.json)"
    )


def write_result(run_dir: Path, result: Any, variant: str, shown: dict[str, Any]) -> None:
    """The run's result document (config.yaml, metrics.json), with the data it trained on."""
    from vitreg.report.train_report import write_train_run
    from vitreg.train.data import open_data

    plain = {k: v for k, v in shown.items() if not isinstance(v, dict)}
    command = _command(variant, plain, verb="train")
    write_train_run(
        run_dir,
        result,
        spec=variant,
        data=shown["data"],
        n_samples=len(open_data(shown["data"])),
        config={"command": "train", "variant": variant, **shown},
        command=command,
    )
