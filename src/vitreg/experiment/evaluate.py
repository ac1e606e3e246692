"""Evaluate one trained variant: frozen-feature probes, artifact diagnosis, parameters and FLOPs.

Each number kept in the compact result names where it came from: probe scores are
``ProbeScores`` means (the full runs are written beside them), the diagnosis numbers are read from
the typed ``DiagnoseResult.results`` (norms verdict and outlier rate, [CLS]/patch cosine per block
before and after ``norm1``), parameters from ``param_report`` and FLOPs from ``flop_report``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitreg.core.io import write_json_atomic
from vitreg.experiment.record import ScoreSummary, SeedDiagnosis, SeedEvaluation, TaskProbes
from vitreg.results.experiment import ExperimentSettings, FlopCounts, ParamCounts
from vitreg.results.probe import ProbeResults

# probe task -> the dataset target it needs
TASK_TARGETS = {"classification": "label", "segmentation": "mask", "depth": "depth"}


def applicable_tasks(targets: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """(tasks the data supports, {skipped task: why})."""
    run, skipped = [], {}
    for task, target in TASK_TARGETS.items():
        if target in targets:
            run.append(task)
        else:
            skipped[task] = f"the data has no {target} targets (it provides {list(targets)})"
    return run, skipped


def majority_rate(val: Any) -> float | None:
    """Share of the most frequent label in the val split (None without labels)."""
    from collections import Counter

    from vitreg.data.datasets import iter_samples

    if "label" not in val.targets:
        return None
    labels = Counter(s.label for _, s in iter_samples(val))
    return max(labels.values()) / sum(labels.values()) if labels else None


def probe_scores(run: ProbeResults) -> dict[str, ScoreSummary]:
    """``{"feature/metric": (mean, ci95, values)}`` of the last layer's base condition."""
    layer = run.conditions["base"][-1]
    return {
        f"{s.feature}/{s.metric}": ScoreSummary(mean=s.mean, ci95=s.ci95, values=s.values)
        for s in layer.scores
        if s.group == "all"
    }


def run_probes(
    model: Any, data: tuple[Any, Any], tasks: list[str], folder: Path, settings: ExperimentSettings
) -> dict[str, TaskProbes]:
    """Every applicable probe on the last block; full runs go to ``folder/probes/<task>.json``."""
    from vitreg.probe.linear import FitSettings
    from vitreg.probe.run import run

    config = FitSettings(
        epochs=settings.probe_epochs,
        seeds=tuple(range(settings.probe_seeds)),
        lrs=settings.probe_lrs,
    )
    out = {}
    for task in tasks:
        result = run(
            model,
            task,
            data,
            cache_dir=folder / "cache",
            config=config,
            batch_size=settings.batch_eval,
        ).results
        write_json_atomic(folder / "probes" / f"{task}.json", result.model_dump(mode="json"))
        notes = result.conditions["base"][-1].notes
        out[task] = TaskProbes(scores=probe_scores(result), notes=list(notes))
    return out


def diagnosis_images(dataset: Any, model: Any, n: int) -> torch.Tensor:
    """The first ``n`` readable images of ``dataset`` as the model's normalised input batch."""
    from vitreg.data.datasets import iter_samples
    from vitreg.data.transforms import model_input, prepare

    size, mean, std = model_input(model)
    images = []
    for _, sample in iter_samples(dataset):
        images.append(prepare(sample, size, mean, std)["image"])
        if len(images) == n:
            break
    return torch.stack(images)


def run_diagnosis(model: Any, images: torch.Tensor, batch_size: int) -> SeedDiagnosis:
    """Outlier verdict and rate, and per-block token-pair cosines around ``norm1``."""
    from vitreg.analysis.diagnose import diagnose

    results = diagnose(model, images, batch_size=batch_size).results
    norms = results.norms
    out: dict[str, Any] = {
        "verdict": norms.verdict,
        "artifacts_present": norms.artifacts_present,
        "outlier_rate": norms.evidence.outlier_rate,
        "emergence_layer": norms.emergence_layer,
        "n_images": int(images.shape[0]),
        "not_applicable": dict(results.not_applicable),
    }
    ln = results.ln_separation
    if ln is not None:
        for point in ("pre_ln1", "post_ln1"):
            for pair in ("cls_patch", "patch_patch", "register_patch"):
                found = [b.get(point, {}).get(pair) for b in ln.similarity]
                values = [v.mean if v is not None else None for v in found]
                if any(v is not None for v in values):
                    out[f"{pair}_{point}"] = values
        out["owned_channel_fraction"] = ln.owned_channel_fraction
    return SeedDiagnosis.model_validate(out)


def costs(model: nn.Module) -> tuple[ParamCounts, FlopCounts]:
    """``param_report`` and ``flop_report`` of the trained backbone."""
    from vitreg.arch import flop_report, param_report

    return param_report(model), flop_report(model)


def evaluate(
    trained: nn.Module,
    data: tuple[Any, Any],
    tasks: list[str],
    folder: Path,
    settings: ExperimentSettings,
) -> SeedEvaluation:
    """Probes, diagnosis and costs of one trained backbone (evaluated in eval mode)."""
    from vitreg.models.wrapping import wrap

    trained.eval()
    model = wrap(trained, weights="trained")  # trained by this experiment
    images = diagnosis_images(data[1], model, settings.diagnose_images)
    params, flops = costs(trained)
    return SeedEvaluation(
        probes=run_probes(model, data, tasks, folder, settings),
        diagnose=run_diagnosis(model, images, settings.batch_eval),
        params=params,
        flops=flops,
    )
