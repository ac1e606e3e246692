"""Dense linear probes on the patch grid: semantic segmentation (mIoU) and monocular depth
(RMSE, AbsRel, δ<1.25), with logits upsampled to label resolution (DINOv2 "lin." protocol)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vitreg.probe import yardsticks
from vitreg.probe.features import CachedFeatures
from vitreg.probe.linear import FitResult, FitSettings
from vitreg.probe.metrics import IGNORE_INDEX, depth_metrics, miou, per_class_iou
from vitreg.probe.tasks.base import (
    Task,
    TaskResult,
    available,
    num_classes,
    probe_scores,
    register_task,
)
from vitreg.results.probe import ClassIoU, TaskInfo


def grid_features(cache: CachedFeatures, layer: str, with_cls: bool = False) -> Tensor:
    """Patch tokens as a grid ``[n, h, w, C]``; with ``with_cls`` the [CLS] token is appended to
    every patch (DINOv2's depth "lin." head reads both)."""
    h, w = cache.layout[layer].grid
    x = cache.get("patches", layer)
    x = x.reshape(x.shape[0], h, w, -1)
    if with_cls:
        cls = cache.get("cls", layer)[:, None, None, :].expand(-1, h, w, -1)
        x = torch.cat([x, cls], dim=-1)
    return x


EXAMPLES = 4  # test images whose first seed's prediction is kept for the report's figure
TRAIN_UPSAMPLING = 4  # training labels are taken at ≤ 4× the patch grid (nearest), for speed


def train_labels(target: Tensor, grid: tuple[int, int]) -> Tensor:
    """``target [n, H, W]`` shrunk (nearest) to at most ``TRAIN_UPSAMPLING`` × the patch grid:
    the head still learns on upsampled logits, at a cost that does not grow with image size.
    Test metrics are always computed at full label resolution."""
    size = [min(s, TRAIN_UPSAMPLING * g) for s, g in zip(target.shape[1:], grid, strict=True)]
    if list(target.shape[1:]) == size:
        return target
    # layout: the channel axis interpolate needs, not tokens
    out = F.interpolate(target[:, None].double(), size=size, mode="nearest")[:, 0]
    return out.to(target.dtype)


def class_table(ious: Tensor, y_test: Tensor, k: int) -> list[ClassIoU]:
    """Per class: IoU mean over seeds (``None`` where the class is absent from prediction and
    target) and its test pixel count."""
    pixels = torch.bincount(y_test[y_test != IGNORE_INDEX].reshape(-1), minlength=k)
    mean = ious.nanmean(0)
    return [
        ClassIoU(
            class_=c,
            iou=None if torch.isnan(mean[c]) else float(mean[c]),
            test_pixels=int(pixels[c]),
        )
        for c in range(k)
    ]


@register_task
class Segmentation(Task):
    name = "segmentation"
    description = "linear head on each patch token, bilinear upsampling; mIoU"
    target = "mask"
    views = ("patches",)
    metrics = {"miou": True}

    def evaluate(
        self, train: CachedFeatures, test: CachedFeatures, layer: str, config: FitSettings
    ) -> TaskResult:
        y_train, y_test = train.targets("mask"), test.targets("mask")
        valid = y_train[y_train != IGNORE_INDEX]
        k = num_classes(train, valid if len(valid) else torch.zeros(1, dtype=torch.long))
        x_test = grid_features(test, layer)
        size = tuple(y_test.shape[1:])
        per_class: list[Tensor] = []
        examples: dict[str, Tensor] = {}

        def evaluate(fit: FitResult) -> dict[str, float]:
            pred = fit.head.predict_dense(x_test, size)
            per_class.append(per_class_iou(pred, y_test, k, IGNORE_INDEX))
            examples.setdefault(
                "prediction", pred[:EXAMPLES].to(torch.uint8 if k <= 255 else torch.long)
            )
            return {"miou": miou(pred, y_test, k, IGNORE_INDEX)}

        def by_miou(pred: Tensor, target: Tensor) -> Tensor:
            """The lr is chosen by held-out mIoU (DINOv2), not pixel accuracy."""
            return torch.tensor([miou(p, target, k, IGNORE_INDEX) for p in pred])

        scores = probe_scores(
            "patches",
            grid_features(train, layer),
            train_labels(y_train, train.layout[layer].grid),
            "ce",
            evaluate,
            self.metrics,
            config,
            len(y_test),
            dense=True,
            out_dim=k,
            ignore_index=IGNORE_INDEX,
            scorer=by_miou,
        )
        ignored = int((y_test == IGNORE_INDEX).sum())
        per = class_table(torch.stack(per_class), y_test, k)
        info = TaskInfo(num_classes=k, ignored_test_pixels=ignored, per_class=per)
        examples["target"] = y_test[:EXAMPLES]
        marks = yardsticks.segmentation(y_train, y_test, k)
        return TaskResult(self.name, layer, scores, [], info, marks, examples)


@register_task
class Depth(Task):
    name = "depth"
    description = (
        "linear depth heads on patch tokens (+[CLS] when present): regression and 256 bins; "
        "RMSE, AbsRel, δ<1.25"
    )
    target = "depth"
    views = ("patches", "cls")
    metrics = {"rmse": False, "abs_rel": False, "delta1": True}

    def evaluate(
        self, train: CachedFeatures, test: CachedFeatures, layer: str, config: FitSettings
    ) -> TaskResult:
        d_train, d_test = train.targets("depth"), test.targets("depth")
        valid = torch.isfinite(d_train) & (d_train > 0)
        max_depth = float(d_train[valid].max()) * 1.05
        size = tuple(d_test.shape[1:])
        heads = {"regression": ("mse", {}), "bins": ("depth_bins", {"max_depth": max_depth})}
        with_cls = available(train, "cls", layer)
        feature = "patches+cls" if with_cls else "patches"
        x_test = grid_features(test, layer, with_cls)
        x_train = grid_features(train, layer, with_cls)
        y_train = train_labels(d_train, train.layout[layer].grid)
        # the regression head learns the offset from the train mean depth: a head started at
        # zero metres would spend its (early-stopped) steps on the bias, not on the features
        mean_depth = float(d_train[valid].mean())
        offsets = {"regression": mean_depth, "bins": 0.0}
        scores = []
        for head, (loss, kw) in heads.items():
            offset = offsets[head]

            def evaluate(fit: FitResult, offset: float = offset) -> dict[str, float]:
                return depth_metrics(fit.head.predict_dense(x_test, size) + offset, d_test)

            scores += probe_scores(
                f"{feature} ({head})",
                x_train,
                y_train - offset,
                loss,
                evaluate,
                self.metrics,
                config,
                len(d_test),
                dense=True,
                **kw,
            )
        invalid = int((~(torch.isfinite(d_test) & (d_test > 0))).sum())
        info = TaskInfo(max_depth=max_depth, mean_depth=mean_depth, invalid_test_pixels=invalid)
        marks = yardsticks.depth(mean_depth, d_test)
        return TaskResult(self.name, layer, scores, [], info, marks)
