"""Image classification from frozen tokens: [CLS], mean patch, registers, test-time registers
and their concatenations (the reassessment found registers add nothing to [CLS] / mean patch;
this lets users check that on their model)."""

from __future__ import annotations

import torch
from torch import Tensor

from vitreg.probe import yardsticks
from vitreg.probe.features import CachedFeatures
from vitreg.probe.linear import FitResult, FitSettings
from vitreg.probe.metrics import topk_accuracy
from vitreg.probe.tasks.base import (
    Task,
    TaskResult,
    available,
    num_classes,
    probe_scores,
    register_task,
)
from vitreg.results.probe import TaskInfo

# feature name -> the views it concatenates (token groups are averaged)
FEATURES: dict[str, tuple[str, ...]] = {
    "cls": ("cls",),
    "patch_mean": ("patch_mean",),
    "cls+patch_mean": ("cls", "patch_mean"),
    "registers": ("reg",),
    "registers+cls": ("reg", "cls"),
    "registers+patch_mean": ("reg", "patch_mean"),
    "test_time_registers": ("extra",),
    "test_time_registers+cls": ("extra", "cls"),
}


def pooled(cache: CachedFeatures, view: str, layer: str) -> Tensor:
    """One vector per image: the view itself, or the mean of a group of tokens (registers)."""
    x = cache.get(view, layer)
    return x.mean(1) if x.dim() == 3 else x


def feature(cache: CachedFeatures, views: tuple[str, ...], layer: str) -> Tensor:
    return torch.cat([pooled(cache, v, layer) for v in views], dim=-1)


@register_task
class Classification(Task):
    name = "classification"
    description = "linear probe on pooled tokens; top-1 / top-5 accuracy"
    target = "label"
    views = ("cls", "reg", "extra", "patch_mean")
    metrics = {"top1": True, "top5": True}

    def evaluate(
        self, train: CachedFeatures, test: CachedFeatures, layer: str, config: FitSettings
    ) -> TaskResult:
        y_train, y_test = train.targets("label"), test.targets("label")
        k = max(num_classes(train, y_train), int(y_test.max()) + 1)
        scores, notes = [], []
        for name, views in FEATURES.items():
            missing = [v for v in views if not available(train, v, layer)]
            if missing:
                notes.append(f"{name}: skipped, {train.manifest.absent[layer][missing[0]]}")
                continue
            x_test = feature(test, views, layer)

            def evaluate(fit: FitResult, x_test: Tensor = x_test) -> dict[str, float]:
                logits = fit.head.logits(x_test)
                out = {"top1": topk_accuracy(logits, y_test, 1)}
                if k > 5:  # with 5 classes or fewer top-5 is 1 by construction
                    out["top5"] = topk_accuracy(logits, y_test, 5)
                return out

            scores += probe_scores(
                name,
                feature(train, views, layer),
                y_train,
                "ce",
                evaluate,
                self.metrics,
                config,
                len(y_test),
                out_dim=k,
            )
        majority = torch.bincount(y_test, minlength=k).max().item() / len(y_test)
        info = TaskInfo(num_classes=k, majority_rate=majority)
        metrics = ("top1", "top5") if k > 5 else ("top1",)
        marks = yardsticks.classification(y_train, y_test, k, metrics)
        return TaskResult(self.name, layer, scores, notes, info, marks)
