"""Unsupervised object discovery: LOST on the patch tokens of each image, scored by CorLoc
against the dataset's boxes (Darcet et al. Table 3, Jiang et al. Table 5). No training: the
test split is used, for each affinity bias of the sweep (Jiang et al. sweep it in [-1, 0])."""

from __future__ import annotations

import numpy as np

from vitreg.probe import yardsticks
from vitreg.probe.features import CachedFeatures
from vitreg.probe.linear import FitSettings
from vitreg.probe.lost import lost
from vitreg.probe.metrics import corloc
from vitreg.probe.tasks.base import Task, TaskResult, register_task, score_over_seeds

BIASES = (0.0, -0.25, -0.5)


@register_task
class ObjectDiscovery(Task):
    name = "object-discovery"
    description = "LOST seed expansion on L2-normalised patch tokens; CorLoc (IoU ≥ 0.5)"
    target = "boxes"
    views = ("patches",)
    metrics = {"corloc": True}

    def evaluate(
        self, train: CachedFeatures, test: CachedFeatures, layer: str, config: FitSettings
    ) -> TaskResult:
        layout = test.layout[layer]
        h, w = layout.grid
        patch = layout.patch_size
        size = (h * patch[0], w * patch[1])
        patches = test.get("patches", layer)
        gts = test.targets("boxes")
        scores = []
        for bias in BIASES:
            boxes = [
                lost(p.reshape(h, w, -1), patch, bias=bias, image_size=size).box for p in patches
            ]
            value = corloc(np.stack(boxes)[:, None, :], [g.numpy() for g in gts])
            scores.append(
                score_over_seeds(
                    f"patches (bias {bias:g})", "corloc", [value], True, n_test=len(gts)
                )
            )
        marks = yardsticks.discovery(gts, size)
        return TaskResult(self.name, layer, scores, [], {"biases": list(BIASES)}, marks)
