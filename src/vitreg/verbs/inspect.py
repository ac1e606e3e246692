"""The inspect verb: load a model and describe it: adapter, class, dims, token layout, attention
path, notes and, if asked, its canonical hook names."""

from __future__ import annotations

from typing import Any

from pydantic import JsonValue

from vitreg.configs import InspectConfig
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.verbs.result import InspectRun, Listener


def describe(model: Any, layout: Any, img_size: int | None, hooks: bool) -> dict[str, JsonValue]:
    """``Model.describe()`` (JSON-ready) with the layout at ``img_size`` and, if asked, the hook
    names."""
    info: dict[str, JsonValue] = {
        **model.describe().model_dump(mode="json", by_alias=True),
        "layout": layout.to_dict(),
    }
    if img_size:
        info["image_size"] = [img_size, img_size]
    if hooks:
        info["hooks"] = model.hook_names()
    return info


def run_inspect(
    cfg: InspectConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> InspectRun:
    """Load ``cfg.spec`` as asked (weights, size, device) and describe it."""
    from vitreg.verbs.loading import load_spec, move

    with progress(None, f"loading {cfg.spec}"):
        model = load_spec(cfg.spec, not cfg.random_init, cfg.weights, cfg.img_size)
    model = move(model, cfg.device)
    layout = model.layout_for((cfg.img_size, cfg.img_size)) if cfg.img_size else model.layout
    return InspectRun(describe(model, layout, cfg.img_size, cfg.hooks), layout)


VERB = register(
    Verb(
        config=InspectConfig,
        run=run_inspect,
        help="Load a model and describe it: adapter, class, dims, token layout, attention path, "
        "notes.",
        argument=("spec",),
        flags={"as_json": "--json"},
    )
)
