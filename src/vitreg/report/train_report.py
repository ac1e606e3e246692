"""The result document of ``vitreg train``: steps, losses, the weights and the data, in the
same envelope as every verb (config.yaml and metrics.json; the step log is log.jsonl)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vitreg.report.run_files import document, write_files


def describe_trained(module: Any, spec: str) -> dict[str, Any]:
    """The model block of the document: vitreg's description when vitreg can wrap the model."""
    from vitreg.errors import VitregError
    from vitreg.models.load import wrap

    try:
        return wrap(module, spec=spec, weights="trained").describe()  # trained by this run
    except VitregError:
        return {
            "spec": spec,
            "family": "unknown",
            "synthetic": False,
            "weights": "trained",
            "layout": {},
            "dims": {},
        }


def write_train_run(
    out_dir: str | Path,
    result: Any,
    *,
    spec: str,
    data: str | Mapping[str, Any],
    n_samples: int | None = None,
    config: dict[str, Any],
    command: str,
) -> Path:
    """config.yaml and (last) metrics.json of a finished training run in ``out_dir``.

    ``data`` is the data block (:func:`vitreg.train.data.describe_training_data`: usable
    samples, skips by reason, warnings) or, as before, the spec alone with ``n_samples``."""
    losses = [r["loss"] for r in result.history]
    weights = Path(out_dir) / "model.safetensors"
    results = {
        "recipe": result.config.recipe,
        "steps": result.steps,
        "total_steps": result.config.steps,
        "final_loss": losses[-1] if losses else None,
        "loss_first": losses[0] if losses else None,
        "resumed_from": result.resumed_from,
        "weights": weights.name if weights.is_file() else None,
        "log": "log.jsonl",
        "train_config": result.config.to_dict(),
    }
    headlines = [
        ("final_loss", "/results/final_loss", False, {"description": "loss at the last step"}),
        ("steps", "/results/steps", None, {"description": "optimizer steps done"}),
    ]
    described = describe_trained(result.model, spec)
    doc = document(
        "train",
        command,
        described,
        dict(data)
        if isinstance(data, Mapping)
        else {"description": data, "n_images": n_samples or 0},
        config,
        results,
        headlines,
    )
    return write_files(Path(out_dir), doc, None, [])
