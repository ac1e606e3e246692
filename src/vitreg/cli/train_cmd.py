"""``vitreg train VARIANT --data D --recipe supervised|dino``: train a ViT, resumable, logged."""

from __future__ import annotations

from typing import Any

from vitreg.cli import options as opt
from vitreg.cli.output import cli_errors, console, show_notice, show_path
from vitreg.cli.progress import progress
from vitreg.configs import TrainRunConfig


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


train_command = opt.config_command(
    TrainRunConfig,
    run_train,
    "Train a ViT (supervised DeiT-III or DINO/iBOT); run under torchrun for data parallelism.",
    argument="variant",
)
