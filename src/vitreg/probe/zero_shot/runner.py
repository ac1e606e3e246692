"""``probe.run`` for a :class:`~vitreg.probe.tasks.model_task.ModelTask`: one pass over the test
split per condition (bare model, under the fix), bad samples skipped and counted as the feature
cache counts them; the result is the same :class:`~vitreg.probe.scores.ProbeScores` other tasks give."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from vitreg import distributed
from vitreg.data.datasets import DataLog, LabeledDataset, SkipSample, open_dataset, require_usable
from vitreg.errors import InputError
from vitreg.fix.base import Fix
from vitreg.models.model import Model
from vitreg.probe.cache import input_config
from vitreg.probe.linear import FitSettings
from vitreg.probe.scores import ProbeScores, data_record, fix_record, probe_results
from vitreg.probe.tasks.base import TaskResult
from vitreg.probe.tasks.model_task import ModelTask
from vitreg.results.probe import DataSetRecord, FeatureCache, ProbeData


def run_model_task(
    probe: ModelTask,
    model: Model,
    data: str | tuple[LabeledDataset, LabeledDataset],
    *,
    fix: Fix | None,
    base: bool,
    options: dict[str, Any],
    batch_size: int,
    image_size: int | None,
    progress: Any,
) -> ProbeScores:
    """Score ``probe`` on the test split of ``data`` (a spec's ``val`` split, or the second of a
    pair) bare (``base``) and/or under ``fix``; the train split is read (under each condition,
    before its test split) only by a task that ``trains``.
    ``options``: ``templates`` (a prompt file for zero-shot, None for OpenAI's 80) and
    ``cache_dir`` (where zero-shot keeps its class embeddings).

    ``progress`` is a :class:`vitreg.progress.Progress` (one phase per condition, in samples).
    Under ``torchrun`` rank 0 scores and the other ranks return a run without results."""
    conditions: dict[str, Fix | None] = {"base": None} if base else {}
    if fix is not None:
        conditions["fixed"] = fix
    if not conditions:
        raise InputError("nothing to probe: base=False needs a fix")
    test = open_dataset(data, "val") if isinstance(data, str) else data[1]
    train = None
    if probe.trains:
        train = open_dataset(data, "train") if isinstance(data, str) else data[0]
        probe.check(tuple(train.targets), train.describe().get("spec", train.name))
    probe.check(tuple(test.targets), test.describe().get("spec", test.name))
    model.eval()
    options = {**options, "image_size": image_size, "progress": progress}
    notes = probe.setup(model, test, options) if distributed.is_main() else []
    results: dict[str, list[TaskResult]] = {}
    passes: dict[str, dict[str, Any]] = {}
    for condition, applied in conditions.items():
        if not distributed.is_main():
            continue
        if train is not None:
            _fit(probe, model, train, condition, applied, passes, batch_size, image_size, progress)
        stage = f"{condition}/test"
        settled = probe.condition(applied)
        scope = applied.applied(model) if applied is not None else contextlib.nullcontext()
        label = f"scoring {probe.name} {stage} (samples)"
        with scope, torch.no_grad(), progress(len(test), label) as update:
            layer = probe.layer(model)
            outputs, targets, passes[stage] = _pass(
                probe, model, test, batch_size, image_size, update
            )
        require_usable(test, "test", passes[stage]["n"], passes[stage]["skipped"])
        result = probe.score(outputs, targets, layer)
        result.notes = notes + settled + result.notes
        results[condition] = [result]
    described = None
    if fix is not None:
        described = fix_record(fix)
    tests = (p for stage, p in passes.items() if stage.endswith("/test"))
    first = next(tests, {"skipped": {}, "repairs": {}})
    tested = data_record(test, first["skipped"], first["repairs"])
    if train is not None:
        trained = passes.get(f"{next(iter(conditions))}/train", {"skipped": {}, "repairs": {}})
        used = data_record(train, trained["skipped"], trained["repairs"])
    else:
        used = DataSetRecord(
            spec=test.describe().get("spec"), split="none, this task trains nothing"
        )
    caches = {stage: FeatureCache.model_validate(p) for stage, p in passes.items()}
    summary = probe_results(
        probe.name,
        ProbeData(train=used, test=tested),
        [probe.layer(model)],
        results,
        caches,
        described,
        probe.description,
        list((options.get("fit") or FitSettings()).seeds) if train is not None else None,
    )
    return ProbeScores(summary, model.describe())


def _fit(
    probe: ModelTask,
    model: Model,
    train: LabeledDataset,
    condition: str,
    applied: Fix | None,
    passes: dict[str, dict[str, Any]],
    batch_size: int,
    image_size: int | None,
    progress: Any,
) -> None:
    """One condition's pass over the train split, handed to ``probe.fit``."""
    stage = f"{condition}/train"
    scope = applied.applied(model) if applied is not None else contextlib.nullcontext()
    label = f"running {probe.name} {stage} (samples)"
    with scope, torch.no_grad(), progress(len(train), label) as update:
        outputs, targets, passes[stage] = _pass(probe, model, train, batch_size, image_size, update)
    require_usable(train, "train", passes[stage]["n"], passes[stage]["skipped"])
    probe.fit(outputs, targets)


def _pass(
    probe: ModelTask,
    model: Model,
    ds: LabeledDataset,
    batch_size: int,
    image_size: int | None,
    update: Any,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """``probe.outputs`` of every usable sample, its targets, and what was skipped/repaired."""
    cfg = input_config(model, image_size)
    target = probe.target
    outputs: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    skipped: dict[str, int] = {}
    batch: list[dict[str, Any]] = []
    done = 0
    passes = 0

    def flush() -> None:
        nonlocal done, passes
        x = torch.stack([item["image"] for item in batch]).to(model.device, model.dtype)
        kept = torch.stack([torch.as_tensor(item[target]) for item in batch])
        out, kept = probe.run_batch(model, x, kept)
        outputs.append(out)
        targets.append(kept)
        done, passes = done + len(batch), passes + 1
        batch.clear()
        update(done)

    def shape(item: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(item["image"].shape), tuple(torch.as_tensor(item[target]).shape)

    outer, ds.log = ds.log, DataLog()  # this pass's counts alone
    try:
        for i in range(len(ds)):
            try:
                sample = ds[i]
            except SkipSample as e:
                skipped[e.reason] = skipped.get(e.reason, 0) + 1
                continue
            item = probe.prepare(sample, cfg)
            if batch and shape(item) != shape(batch[0]):  # sizes differ: one batch per size
                flush()
            batch.append(item)
            if len(batch) == batch_size:
                flush()
        if batch:
            flush()
        repairs = {r: n for r, n in ds.log.to_dict().items() if r not in skipped}
    finally:
        ds.log = outer
    info = {"folder": None, "n": done, "forward_passes": passes}
    info |= {"skipped": skipped, "repairs": repairs}
    if not outputs:
        return torch.empty(0), torch.empty(0), info
    return torch.cat(outputs), torch.cat(targets), info
