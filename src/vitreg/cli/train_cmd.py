"""``vitreg train VARIANT --data D --recipe supervised|dino``: train a ViT, resumable, logged."""

from __future__ import annotations

from typing import Any

from vitreg.cli.output import console, show_path


def show_run(run: Any, cfg: Any) -> None:
    """The summary of a training run: steps, final loss and what the folder holds."""
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
