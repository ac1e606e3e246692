"""``run_variants``: train, probe and diagnose every grid entry and write one comparison report.

Each (variant, seed) works in ``OUT/variants/<name>/seed-<k>/``: ``train/`` (checkpoints, so an
interrupted run resumes mid-training), ``cache/`` (probe features), ``probes/`` and, once
complete, ``result.json``; a rerun with the same settings reuses a complete result and skips
the work. The comparison report (metrics.json, report.md, report.html, figures) is rewritten
atomically after every variant, so a partial experiment always has a readable report.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, JsonValue, ValidationError
from torch import nn

from vitreg.core.io import write_json_atomic
from vitreg.errors import InputError, SpecError, UnsupportedModelError, WeightsError
from vitreg.experiment.evaluate import applicable_tasks, evaluate, majority_rate
from vitreg.experiment.grid import BASE, finetune_variants, grid, preset
from vitreg.experiment.record import ExperimentPlan, SeedRecord, SeedRunConfig, SeedTraining
from vitreg.experiment.summary import SUMMARY
from vitreg.progress import SILENT, Progress
from vitreg.report.writer import as_json
from vitreg.results.experiment import (
    AS_GIVEN,
    ExperimentResults,
    ExperimentSettings,
    SeedStats,
    Variant,
    VariantSummary,
    VariantTime,
)
from vitreg.results.schema import plain
from vitreg.train.dino import DinoOptions, loss_terms

Log = Callable[[str], None]


@dataclass
class ExperimentResult:
    """Where the report is, its typed results (each variant over its training seeds, whether
    every variant is done) and the metrics.json written last."""

    out_dir: Path
    results: ExperimentResults
    wall_time_s: float
    document: dict[str, Any] | None = None


def data_spec(data: str) -> str:
    """A dataset spec; a plain existing directory means ``imagefolder:DIR``."""
    if ":" not in data and Path(data).is_dir():
        return f"imagefolder:{data}"
    return data


def open_splits(spec: str) -> tuple[Any, Any]:
    """(train, val) splits of ``spec``; an empty image folder raises :class:`InputError`."""
    from vitreg.probe.run import splits

    train, val = splits(spec)
    for split, ds in (("train", train), ("val", val)):
        if len(ds) == 0:
            raise InputError(f"the {split} split of {spec} has no images; add images to it")
    return train, val


def check_finetune(name: str, settings: ExperimentSettings) -> None:
    """Fail before any training if ``name`` is not a timm ViT the variants can convert."""
    import timm

    from vitreg.arch.variant import check_model

    if not timm.is_model(name):
        raise SpecError(
            f"--finetune {name!r} is not a timm model name; pick a ViT, e.g. vit_tiny_patch16_224"
        )
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, img_size=settings.img_size)
    check_model(model)


def source_model(
    v: Variant, settings: ExperimentSettings, seed: int, pretrained: bool
) -> tuple[nn.Module, list[str]]:
    """The fine-tuning entry's model: the timm model, converted when the entry specialises."""
    import timm

    from vitreg.arch import create_variant
    from vitreg.models.load import offline_hint

    torch.manual_seed(seed)
    try:
        model = timm.create_model(
            v.finetune, pretrained=pretrained, img_size=settings.img_size, num_classes=0
        )
    except (OSError, RuntimeError) as err:
        if not pretrained:
            raise
        raise WeightsError(offline_hint(f"timm weights of {v.finetune}", err)) from None
    notes = [] if pretrained else ["random init (pretrained=False): no weights were loaded"]
    comps = tuple(v.options.specialize)
    if "ls" in comps and not all(hasattr(b.ls1, "gamma") for b in model.blocks):
        comps = tuple(c for c in comps if c != "ls")
        notes.append(f"{v.finetune} has no LayerScale, so 'ls' was not specialised")
    if comps:
        model = create_variant(model, specialize=comps)
    return model, notes


def train_variant(
    v: Variant,
    seed: int,
    out: Path,
    settings: ExperimentSettings,
    data: Any,
    pretrained: bool,
    progress: Progress = SILENT,
) -> tuple[Any, list[str]]:
    """Train one entry (resuming from ``out``'s checkpoints; its steps reported to
    ``progress``); returns (TrainResult, notes)."""
    from vitreg.train import TrainSettings, train

    label = f"training {v.name} seed {seed} (steps)"
    run = TrainSettings(
        recipe=settings.recipe,
        steps=settings.steps,
        batch_size=settings.batch_size,
        lr=settings.lr,
        seed=seed,
        img_size=settings.img_size,
        checkpoint_every=max(1, settings.steps // 4),
    )
    options = settings.dino.model_dump() if settings.recipe == "dino" else None
    if v.finetune is not None:
        model, notes = source_model(v, settings, seed, pretrained)
        return train(model, data, run, out, options=options, progress=progress, label=label), notes
    spec = {"base": BASE, **v.options.model_dump()}
    kwargs = settings.model_kwargs()
    result = train(
        spec, data, run, out, model_kwargs=kwargs, options=options, progress=progress, label=label
    )
    return result, []


def run_config(
    v: Variant, seed: int, settings: ExperimentSettings, spec: str, pretrained: bool
) -> SeedRunConfig:
    """What a (variant, seed) result depends on; a saved result is reused only if it matches."""
    return SeedRunConfig(
        variant=v,
        seed=seed,
        settings=settings,
        data=spec,
        pretrained=pretrained and v.finetune is not None,
    )


def write_record(path: Path, record: BaseModel) -> None:
    """Write one of the experiment's own records (DINO options in the order given)."""
    write_json_atomic(path, plain(record.model_dump(context=AS_GIVEN)))


def saved_record(done: Path, config: SeedRunConfig) -> SeedRecord:
    """The complete ``result.json`` at ``done``, if it was made with ``config``."""
    saved = json.loads(done.read_text())
    if saved.get("config") != config.model_dump(mode="json"):
        raise InputError(
            f"{done} was made with other settings; use the same settings, another --out, "
            "or delete that folder to recompute it"
        )
    try:
        return SeedRecord.model_validate(saved)
    except ValidationError as err:
        raise InputError(
            f"{done} is not a complete result ({err.error_count()} fields wrong); delete that "
            "folder to recompute it"
        ) from None


def run_one(
    v: Variant,
    seed: int,
    out: Path,
    settings: ExperimentSettings,
    spec: str,
    data: tuple[Any, Any],
    tasks: list[str],
    pretrained: bool,
    log: Log,
    progress: Progress = SILENT,
) -> SeedRecord:
    """Train and evaluate one (variant, seed), or reuse its complete ``result.json``."""
    folder = out / "variants" / v.name / f"seed-{seed}"
    config = run_config(v, seed, settings, spec, pretrained)
    done = folder / "result.json"
    if done.exists():
        saved = saved_record(done, config)
        log(f"{v.name} seed {seed}: complete, reused")
        return saved.model_copy(update={"reused": True})
    log(f"{v.name} seed {seed}: training {settings.steps} steps ({settings.recipe})")
    t0 = time.perf_counter()
    result, notes = train_variant(
        v, seed, folder / "train", settings, data[0], pretrained, progress
    )
    t_train = time.perf_counter() - t0
    log(f"{v.name} seed {seed}: probing ({', '.join(tasks)}) and diagnosing")
    evaluated = evaluate(result.model, data, tasks, folder, settings)
    losses = result.losses
    opts = result.config.options  # the [CLS] DINO term: a DINO run's only
    terms = loss_terms(result.history, opts) if isinstance(opts, DinoOptions) else None
    record = SeedRecord(
        config=config,
        train=SeedTraining(
            steps=result.steps,
            first_loss=losses[0] if losses else None,
            final_loss=losses[-1] if losses else None,
            losses=losses,
            dino_terms=terms,
            resumed_from=result.resumed_from,
            notes=notes,
        ),
        **dict(evaluated),
        time_s=VariantTime(train=t_train, evaluate=time.perf_counter() - t0 - t_train),
    )
    write_record(done, record)
    return record


PER_BLOCK = ("cls_patch_pre_ln1", "cls_patch_post_ln1", "register_patch_post_ln1")


def _stats(values: list[Any]) -> SeedStats:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return SeedStats(mean=None, std=None, values=[])
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
    return SeedStats(mean=mean, std=std, values=vals)


def summarise(v: Variant, runs: list[SeedRecord], folder: str) -> VariantSummary:
    """One variant's numbers over its training seeds (mean, sample std, values), from each
    seed's ``result.json`` record."""
    summary = {key: _stats([get(r) for r in runs]) for key, (get, _) in SUMMARY.items()}
    blocks: dict[str, list[float | None]] = {}
    for key in PER_BLOCK:
        per_seed = [col for r in runs if (col := getattr(r.diagnose, key))]
        if per_seed:
            blocks[key] = [_stats(list(col)).mean for col in zip(*per_seed, strict=True)]
    notes = sorted({n for r in runs for n in r.train.notes})
    first = runs[0]
    return VariantSummary(
        **dict(v),
        folder=folder,
        seeds=[r.config.seed for r in runs],
        summary=summary,
        per_block=blocks,
        params=first.params,
        flops=first.flops,
        verdicts=[r.diagnose.verdict for r in runs],
        losses=[r.train.losses for r in runs],
        dino_terms=first.train.dino_terms,
        time_s=VariantTime(
            train=sum(r.time_s.train for r in runs),
            evaluate=sum(r.time_s.evaluate for r in runs),
        ),
        reused=all(r.reused for r in runs),
        notes=notes,
    )


def check_plan(out: Path, plan: ExperimentPlan) -> None:
    """Write ``experiment.json``, or check that an existing one has the same settings and data."""
    path = out / "experiment.json"
    if path.exists():
        saved = json.loads(path.read_text())
        now = plan.model_dump(mode="json")
        diff = [k for k in ("settings", "data") if saved.get(k) != now[k]]
        if diff:
            raise InputError(
                f"{out} holds an experiment with other {' and '.join(diff)}; rerun with the "
                "same settings to continue it, or pass another --out"
            )
    write_record(path, plan)


def run_variants(
    data: str,
    out_dir: str | Path,
    settings: ExperimentSettings | None = None,
    *,
    variants: Sequence[Variant] | None = None,
    finetune: str | None = None,
    pretrained: bool = False,
    log: Log | None = None,
    command: str = "",
    config: dict[str, JsonValue] | None = None,
    progress: Progress = SILENT,
) -> ExperimentResult:
    """Train, probe and diagnose each entry of the grid on ``data``; write the comparison report.

    ``variants`` defaults to :func:`grid` (plus the fine-tuning pair with ``finetune``).
    Complete entries in ``out_dir`` are reused, so an interrupted experiment continues;
    ``progress`` shows the entries done and each one's training steps.
    ``config`` is the run's config.yaml (and metrics.json ``config``): the CLI passes its typed
    :class:`~vitreg.configs.ExperimentConfig` (``to_file()``) so that ``--config`` reruns it;
    by default it is ``settings``.
    """
    from vitreg.experiment.report import write_report

    t0 = time.perf_counter()
    settings = settings or preset("tiny")
    log = log or (lambda _: None)
    spec = data_spec(data)
    splits = open_splits(spec)
    if settings.recipe == "supervised" and not splits[0].num_classes:
        raise InputError("the supervised recipe needs class labels; use --recipe dino")
    tasks, skipped = applicable_tasks(tuple(splits[0].targets))
    chosen = list(variants) if variants is not None else grid()
    if finetune is not None:
        check_finetune(finetune, settings)
        chosen += finetune_variants(finetune)
    names = [v.name for v in chosen]
    if len(set(names)) != len(names) or not names:
        raise SpecError(f"variant names must be unique and at least one given, got {names}")
    out = Path(out_dir)
    plan = ExperimentPlan(
        settings=settings,
        data=spec,
        variants=chosen,
        tasks=tasks,
        skipped_tasks=skipped,
        majority_rate=majority_rate(splits[1]),
        pretrained=pretrained,
    )
    check_plan(out, plan)
    done: list[VariantSummary] = []
    document = None
    with progress(
        len(chosen) * settings.seeds, "experiment: every variant x seed (models)"
    ) as update:
        for i, v in enumerate(chosen):
            log(f"[{i + 1}/{len(chosen)}] {v.name}")
            runs = []
            try:
                for s in range(settings.seeds):
                    runs.append(
                        run_one(v, s, out, settings, spec, splits, tasks, pretrained, log, progress)
                    )
                    update(i * settings.seeds + s + 1)
            except UnsupportedModelError as err:
                raise SpecError(f"variant {v.name}: {err}") from None
            done.append(summarise(v, runs, f"variants/{v.name}"))
            wall = time.perf_counter() - t0  # the report so far, after every entry
            document = write_report(out, plan, done, len(chosen), wall, command, splits, config)
    assert document is not None  # at least one variant, each followed by its report
    wall = time.perf_counter() - t0
    return ExperimentResult(out, document.results, wall, as_json(document))
