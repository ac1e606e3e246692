"""``probe.run``: extract (or reuse) features of the train and test splits, with and/or without a
fix, and score one task at each layer; the result is what ``vitreg probe`` writes to disk."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from vitreg import distributed
from vitreg.data.datasets import (
    DataLog,
    LabeledDataset,
    SkipSample,
    open_dataset,
    require_usable,
)
from vitreg.data.transforms import prepare
from vitreg.errors import InputError
from vitreg.fix.base import Fix
from vitreg.models.model import Model
from vitreg.probe.cache import extract, input_config
from vitreg.probe.features import CachedFeatures
from vitreg.probe.linear import FitSettings
from vitreg.probe.scores import ProbeScores, data_record, fix_record, probe_results
from vitreg.probe.tasks import Task, TaskResult, get_task
from vitreg.progress import SILENT, Progress
from vitreg.results.probe import FeatureCache, ProbeData


def splits(data: str | tuple[LabeledDataset, LabeledDataset]) -> tuple[Any, Any]:
    """(train, test) datasets of a spec (its ``train`` and ``val`` splits) or a given pair."""
    if isinstance(data, str):
        return open_dataset(data, "train"), open_dataset(data, "val")
    train, test = data
    return train, test


def run(
    model: Model,
    task: str,
    data: str | tuple[LabeledDataset, LabeledDataset],
    *,
    fix: Fix | None = None,
    base: bool = True,
    layers: Sequence[int | str] = (-1,),
    cache_dir: str | Path,
    config: FitSettings | None = None,
    batch_size: int = 32,
    templates: str | Path | None = None,
    image_size: int | None = None,
    task_options: dict[str, Any] | None = None,
    progress: Progress = SILENT,
) -> ProbeScores:
    """Score ``task`` on ``data`` at ``layers``: the bare model (``base``) and/or under ``fix``.

    Features are cached under ``cache_dir`` and reused by later runs (no forward pass then);
    ``progress`` reports extraction (samples), cache hits and probe training (a phase per
    condition over the layers, each fit's epochs inside it, unless ``config`` has its own).
    Under ``torchrun`` each rank extracts its share of the shards and only rank 0 trains and
    scores the probes (the other ranks return a run without results). ``task_options`` go to
    a task that runs the model itself (ov-seg: ``pamr_steps``, ``pamr_dilations``)."""
    probe = get_task(task)
    if getattr(probe, "scores_model", False):  # zero-shot, attention-seg: no cache, no training
        from vitreg.probe.zero_shot.runner import run_model_task

        return run_model_task(
            probe,
            model,
            data,
            fix=fix,
            base=base,
            options={
                "templates": templates,
                "cache_dir": cache_dir,
                "fit": config,
                **(task_options or {}),
            },
            batch_size=batch_size,
            image_size=image_size,
            progress=progress,
        )
    if templates is not None:
        raise InputError(f"templates are the zero-shot task's prompts; task {task!r} takes none")
    train, test = splits(data)
    for ds in (train, test):
        probe.check(tuple(ds.targets), ds.describe().get("spec", ds.name))
    conditions = _conditions(base, fix)
    config = config or FitSettings()
    if config.progress is None:
        config = replace(config, progress=progress)
    return _probe_cached(
        task,
        probe,
        model,
        (train, test),
        conditions,
        config,
        layers=layers,
        cache_dir=cache_dir,
        batch_size=batch_size,
        image_size=image_size,
        progress=progress,
    )


def _conditions(base: bool, fix: Fix | None) -> dict[str, Fix | None]:
    """The conditions to probe, in order: ``base`` (no fix) and/or ``fixed`` (under ``fix``)."""
    conditions: dict[str, Fix | None] = {"base": None} if base else {}
    if fix is not None:
        conditions["fixed"] = fix
    if not conditions:
        raise InputError("nothing to probe: base=False needs a fix")
    return conditions


def _probe_cached(
    task: str,
    probe: Task,
    model: Model,
    data: tuple[LabeledDataset, LabeledDataset],
    conditions: dict[str, Fix | None],
    config: FitSettings,
    *,
    layers: Sequence[int | str],
    cache_dir: str | Path,
    batch_size: int,
    image_size: int | None,
    progress: Progress,
) -> ProbeScores:
    """The cached-feature path of :func:`run`: each condition's features, then its probes."""
    train, test = data
    results: dict[str, list[TaskResult]] = {}
    caches: dict[str, FeatureCache] = {}
    names: list[str] = []
    for condition, applied in conditions.items():
        cached: dict[str, CachedFeatures] = {}
        for split, ds in (("train", train), ("test", test)):
            stage = f"{condition}/{split}"
            cached[split] = _extract_split(
                model,
                probe,
                ds,
                stage,
                applied,
                layers=layers,
                cache_dir=cache_dir,
                batch_size=batch_size,
                image_size=image_size,
                progress=progress,
            )
            caches[stage] = _cache_record(cached[split])
            # a split all of whose samples were skipped: say which one and why
            require_usable(ds, split, cached[split].n, cached[split].manifest.skipped)
        names = cached["train"].layers
        if not distributed.is_main():  # under torchrun every rank extracts; rank 0 scores
            continue
        results[condition] = _train_probes(probe, cached, names, config, condition, progress)
    fix = conditions.get("fixed")
    described = None
    if fix is not None:
        described = fix_record(fix)
    shown = [r for rs in results.values() for r in rs if r.examples]
    images = example_images(test, input_config(model, image_size), shown) if shown else {}
    first = next(iter(conditions))
    records = {
        s: data_record(ds, caches[f"{first}/{s}"].skipped, caches[f"{first}/{s}"].repairs or {})
        for s, ds in (("train", train), ("test", test))
    }
    data_desc = ProbeData(train=records["train"], test=records["test"])
    summary = probe_results(
        task,
        data_desc,
        names,
        results,
        caches,
        described,
        probe.description,
        list(config.seeds),
    )
    return ProbeScores(summary, model.describe(), images)


def _extract_split(
    model: Model,
    probe: Task,
    ds: LabeledDataset,
    stage: str,
    applied: Fix | None,
    *,
    layers: Sequence[int | str],
    cache_dir: str | Path,
    batch_size: int,
    image_size: int | None,
    progress: Progress,
) -> CachedFeatures:
    """One split's features under one condition, extracted or read back from the cache."""
    with progress(len(ds), f"extracting features {stage} (samples)") as update:
        cached = extract(
            model,
            ds,
            layers=layers,
            views=probe.views,
            fix=applied,
            root=cache_dir,
            batch_size=batch_size,
            pixels=probe.pixels,
            image_size=image_size,
            progress=update,
        )
        if cached.forward_passes == 0:
            update(len(ds), source="cache")
            progress.note(
                f"cache hit: {cached.n} features, 0 forward passes ({stage}, {cached.folder})"
            )
    return cached


def _cache_record(cached: CachedFeatures) -> FeatureCache:
    """What the run records of one split's cache: folder, size, passes, skips and repairs,
    and the shards found damaged on disk and extracted again, by reason."""
    return FeatureCache(
        folder=str(cached.folder),
        n=cached.n,
        forward_passes=cached.forward_passes,
        skipped=cached.manifest.skipped,
        repairs=cached.manifest.repairs,
        replaced=cached.manifest.replaced,
    )


def _train_probes(
    probe: Task,
    cached: dict[str, CachedFeatures],
    names: list[str],
    config: FitSettings,
    condition: str,
    progress: Progress,
) -> list[TaskResult]:
    """One condition's probes, each layer's trained on the train features, scored on the test."""
    scored: list[TaskResult] = []
    with progress(len(names), f"training probes {condition} (layers)") as update:
        for name in names:
            scored.append(probe.evaluate(cached["train"], cached["test"], name, config))
            update(len(scored))
    return scored


def example_images(
    ds: LabeledDataset, input: dict[str, int | list[float]], shown: list[TaskResult]
) -> dict[str, torch.Tensor | list[float]]:
    """The first test samples the extraction kept (skipped ones left out, as in the cache), as
    the model saw them: ``images [n, 3, S, S]`` normalised with ``mean``/``std``."""
    n = max(len(r.examples["target"]) for r in shown)
    images = []
    logged = isinstance(getattr(ds, "log", None), DataLog)
    if logged:  # these reads repeat the extraction's: they are not counted twice
        outer, ds.log = ds.log, DataLog()
    try:
        for i in range(len(ds)):
            if len(images) == n:
                break
            try:
                sample = ds[i]
            except SkipSample:
                continue
            images.append(prepare(sample, input["size"], input["mean"], input["std"])["image"])
    finally:
        if logged:
            ds.log = outer
    return {"images": torch.stack(images), "mean": input["mean"], "std": input["std"]}
