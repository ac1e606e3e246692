"""The train verb: train a ViT (supervised DeiT III or DINO/iBOT), resumable, and write its result
document, as ``vitreg train`` does."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from vitreg.configs import TrainRunConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.errors import InputError
from vitreg.progress import SILENT, Progress
from vitreg.results.schema import ModelInfo, model_info
from vitreg.results.train import TrainResults
from vitreg.verbs.common import command_line, default_run_dir, slug
from vitreg.verbs.result import Listener, Notice, Notices, TrainRun

if TYPE_CHECKING:
    from vitreg.train.loop import TrainResult


def parse_pairs(pairs: list[str] | None) -> dict[str, JsonValue]:
    """``["depth=2", "mask_ratio=[0.1,0.5]"]`` -> ``{"depth": 2, "mask_ratio": [0.1, 0.5]}``
    (values are JSON where they parse, else strings; the config has checked the KEY=VALUE form)."""
    out: dict[str, JsonValue] = {}
    for pair in pairs or []:
        key, _, raw = pair.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def train_settings(cfg: TrainRunConfig) -> Any:
    """The :class:`~vitreg.settings.train.TrainSettings` part of a run config."""
    from vitreg.settings.train import TrainSettings

    return TrainSettings(**cfg.model_dump(include=set(TrainSettings.model_fields)))


def train_command_line(cfg: TrainRunConfig) -> str:
    """The command line that reproduces the run of ``cfg`` (repeatable options repeated)."""
    values = cfg.model_dump(exclude={"variant", "model_arg", "option", "resume"})
    parts = shlex.split(command_line(cfg.variant, values, verb="train"))
    parts += [] if cfg.resume else ["--no-resume"]
    for flag, pairs in (("--model-arg", cfg.model_arg), ("--option", cfg.option)):
        parts += [x for pair in pairs or [] for x in (flag, pair)]
    return shlex.join(parts)


@session()  # the --out claimed inside is released when the verb ends
def run_train(
    cfg: TrainRunConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> TrainRun:
    """Train ``cfg``'s variant on its data and write the run directory (checkpoints, log.jsonl,
    model.safetensors, config.yaml, metrics.json)."""
    from vitreg.core.out_dir import check_out
    from vitreg.report.renderers.train import write_train_run
    from vitreg.report.writer import as_json
    from vitreg.train import train
    from vitreg.train.data import describe_training_data

    if cfg.out is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise InputError(
            "under torchrun pass --out DIR, so that every rank uses the same run directory"
        )
    run_dir = cfg.out if cfg.out is not None else default_run_dir(slug(cfg.variant), verb="train")
    cfg = cfg.model_copy(update={"out": run_dir})
    check_out(run_dir, "train", cfg.variant, cfg.overwrite)
    result = train(
        cfg.variant,
        cfg.data,
        train_settings(cfg),
        run_dir,
        model_kwargs=parse_pairs(cfg.model_arg),
        options=parse_pairs(cfg.option),
        progress=progress,  # rank 0 only
    )
    if int(os.environ.get("RANK", "0")) != 0:
        return TrainRun("train", run_dir, None, [], training=result)
    notices = Notices(on_notice)
    if result.resumed_from is not None:
        notices.append(
            Notice("resumed", f"resumed from the checkpoint at step {result.resumed_from}")
        )
    document = write_train_run(
        run_dir,
        train_results(result, run_dir),
        result.history,
        described=describe_trained(result.model, cfg.variant),
        data=describe_training_data(cfg.data, recipe=cfg.recipe),
        config=cfg,
        command=train_command_line(cfg),
    )
    return TrainRun("train", run_dir, as_json(document), notices.items, training=result)


def train_results(result: TrainResult, run_dir: Path) -> TrainResults:
    """The results of a finished training run in ``run_dir``: recipe, steps, first and last
    loss, the files it wrote, its settings and (DINO) the [CLS] loss terms."""
    from vitreg.results.train import DinoOptions
    from vitreg.train.dino import loss_terms

    losses = result.losses
    options = result.config.options
    terms = loss_terms(result.history, options) if isinstance(options, DinoOptions) else None
    weights = Path(run_dir) / "model.safetensors"
    return TrainResults(
        recipe=result.config.recipe,
        steps=result.steps,
        total_steps=result.config.steps,
        final_loss=losses[-1] if losses else None,
        loss_first=losses[0] if losses else None,
        resumed_from=result.resumed_from,
        weights=weights.name if weights.is_file() else None,
        log="log.jsonl",
        train_config=result.config,
        dino_terms=terms,
    )


def describe_trained(module: Any, spec: str) -> ModelInfo:
    """The model block of a training run's document: vitreg's description of the trained
    module when vitreg can wrap it, else what is known without it."""
    from vitreg.errors import VitregError
    from vitreg.models.wrapping import wrap

    try:
        described = wrap(module, spec=spec, weights="trained").describe()  # trained by this run
    except VitregError:
        return ModelInfo(
            spec=spec, family="unknown", synthetic=False, weights="trained", layout={}, dims={}
        )
    return model_info(described)


VERB = register(
    Verb(
        config=TrainRunConfig,
        run=run_train,
        help="Train a ViT (supervised DeiT-III or DINO/iBOT); run under torchrun for data parallelism.",
        results=TrainResults,
        renderer="vitreg.report.renderers.train",
        resumes=True,
        argument=("variant",),
    )
)
