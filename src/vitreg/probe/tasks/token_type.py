"""Which token types carry global (image-level) information: one token per image — [CLS], the
central normal patch, the top outlier patch, a trained register, a test-time register — each
probed for the image label (Darcet et al. Table 1 / Jiang et al. Table 1 protocol)."""

from __future__ import annotations

import math

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
    outlier_threshold,
    probe_scores,
    register_task,
)
from vitreg.probe.views import center_index
from vitreg.results.probe import TaskInfo


def token(cache: CachedFeatures, name: str, layer: str, threshold: float) -> tuple[Tensor, Tensor]:
    """The token ``name`` of every image and which images qualify (centre patch not an
    outlier; top-norm patch an outlier)."""
    if name == "cls":
        x = cache.get("cls", layer)
        return x, torch.ones(len(x), dtype=torch.bool)
    if name in ("register", "test_time_register"):
        # layout: the first token of the layout's register (or extra) view
        x = cache.get("reg" if name == "register" else "extra", layer)[:, 0]
        return x, torch.ones(len(x), dtype=torch.bool)
    norms = cache.get("patch_norms", layer)  # read from every shard: only where needed
    if name == "patch_center":
        centre = center_index(cache.layout[layer])
        return cache.get("patch_center", layer), norms[:, centre] <= threshold
    top = cache.get("patch_top_index", layer)
    top_norm = norms.gather(1, top.view(-1, 1)).squeeze(1)
    return cache.get("patch_top", layer), top_norm > threshold


VIEWS = {
    "cls": "cls",
    "patch_center": "patch_center",
    "patch_top": "patch_top",
    "register": "reg",
    "test_time_register": "extra",
}


@register_task
class TokenType(Task):
    name = "token-type"
    description = "one token per image ([CLS], centre patch, top outlier, register, test-time register) → image label"
    target = "label"
    views = ("cls", "reg", "extra", "patch_center", "patch_top")
    metrics = {"top1": True}
    token_level = True

    def evaluate(
        self, train: CachedFeatures, test: CachedFeatures, layer: str, config: FitSettings
    ) -> TaskResult:
        y_train, y_test = train.targets("label"), test.targets("label")
        k = max(num_classes(train, y_train), int(y_test.max()) + 1)
        threshold, fit = outlier_threshold(train.get("patch_norms", layer))
        scores, notes, counts = [], [], {}
        for name, view in VIEWS.items():
            if not available(train, view, layer):
                notes.append(f"{name}: skipped, {train.manifest.absent[layer][view]}")
                continue
            x_tr, keep_tr = token(train, name, layer, threshold)
            x_te, keep_te = token(test, name, layer, threshold)
            if name == "patch_top" and not math.isfinite(threshold):
                notes.append(
                    "patch_top: no outlier mode at this layer, so the top-norm patch of every "
                    "image is probed (it is not an outlier)"
                )
                keep_tr, keep_te = torch.ones_like(keep_tr), torch.ones_like(keep_te)
            counts[name] = {"train": int(keep_tr.sum()), "test": int(keep_te.sum())}
            if keep_tr.sum() < 2 or keep_te.sum() < 1:
                notes.append(f"{name}: skipped, too few qualifying images ({counts[name]})")
                continue
            x_eval, y_eval = x_te[keep_te], y_test[keep_te]

            def evaluate(fit_: FitResult, x: Tensor = x_eval, y: Tensor = y_eval) -> dict:
                return {"top1": topk_accuracy(fit_.head.logits(x), y, 1)}

            scores += probe_scores(
                name,
                x_tr[keep_tr],
                y_train[keep_tr],
                "ce",
                evaluate,
                self.metrics,
                config,
                len(y_eval),
                out_dim=k,
            )
        info = TaskInfo(num_classes=k, outlier_threshold=threshold, bimodal_fit=fit, images=counts)
        marks = yardsticks.classification(y_train, y_test, k, ("top1",))
        return TaskResult(self.name, layer, scores, notes, info, marks)
