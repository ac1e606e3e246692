"""Probe metrics (accuracy, mIoU, depth errors, box IoU, CorLoc) and the 95% CI over seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

IGNORE_INDEX = 255

#: Metric name -> higher_is_better, so reports and comparisons know which way is "better".
METRICS: dict[str, bool] = {
    "top1": True,
    "top5": True,
    "accuracy": True,
    "miou": True,
    "rmse": False,
    "abs_rel": False,
    "delta1": True,
    "mse": False,
    "mean_distance": False,
    "corloc": True,
}


def topk_accuracy(logits: Tensor, y: Tensor, k: int = 1) -> float:
    """Fraction of rows whose true class is among the ``k`` largest logits."""
    k = min(k, logits.shape[-1])
    top = logits.topk(k, dim=-1).indices
    return (top == y.unsqueeze(-1)).any(-1).float().mean().item()


def _valid_classes(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int | None):
    keep = (
        target != ignore_index if ignore_index is not None else torch.ones_like(target, dtype=bool)
    )
    t, p = target[keep], pred[keep]
    present = torch.zeros(num_classes, dtype=torch.bool)
    present[t.unique()] = True
    present[p[(p >= 0) & (p < num_classes)].unique()] = True
    return present


def per_class_iou(
    pred: Tensor, target: Tensor, num_classes: int, ignore_index: int | None = IGNORE_INDEX
) -> Tensor:
    """IoU per class over all pixels pooled (dataset-level); NaN for a class absent from both."""
    from torchmetrics.classification import MulticlassJaccardIndex

    metric = MulticlassJaccardIndex(num_classes, average="none", ignore_index=ignore_index)
    iou = metric(pred.reshape(-1).long(), target.reshape(-1).long()).float()
    present = _valid_classes(pred.reshape(-1), target.reshape(-1), num_classes, ignore_index)
    return torch.where(present, iou, torch.nan)


def miou(
    pred: Tensor, target: Tensor, num_classes: int, ignore_index: int | None = IGNORE_INDEX
) -> float:
    """Mean IoU over classes present in prediction or target, pixels pooled over the dataset
    (torchmetrics ``MulticlassJaccardIndex(average="macro")``, ``ignore_index`` pixels skipped)."""
    from torchmetrics.classification import MulticlassJaccardIndex

    metric = MulticlassJaccardIndex(num_classes, average="macro", ignore_index=ignore_index)
    return metric(pred.reshape(-1).long(), target.reshape(-1).long()).item()


def _depth_one(pred: Tensor, gt: Tensor, valid: Tensor) -> dict[str, float]:
    p, g = pred[valid].double().clamp_min(1e-6), gt[valid].double()
    ratio = torch.maximum(p / g, g / p)
    return {
        "rmse": (p - g).pow(2).mean().sqrt().item(),
        "abs_rel": ((p - g).abs() / g).mean().item(),
        "delta1": (ratio < 1.25).double().mean().item(),
    }


def depth_metrics(
    pred: Tensor, gt: Tensor, *, max_depth: float | None = None, per_image: bool = True
) -> dict[str, float]:
    """RMSE, AbsRel and δ<1.25 over valid pixels (gt finite and > 0, and ≤ ``max_depth`` if
    given). For ``[n, H, W]`` input with ``per_image`` the metrics are computed per image and
    averaged over images with any valid pixel (the usual NYUv2 evaluation); otherwise pixels are
    pooled. Predictions are clamped to ≥ 1e-6 so the ratio metrics stay defined."""
    valid = torch.isfinite(gt) & (gt > 0)
    if max_depth is not None:
        valid &= gt <= max_depth
    if not per_image or gt.dim() < 3:
        if not valid.any():
            return {k: math.nan for k in ("rmse", "abs_rel", "delta1")}
        return _depth_one(pred, gt, valid)
    rows = [_depth_one(p, g, v) for p, g, v in zip(pred, gt, valid, strict=True) if v.any()]
    if not rows:
        return {k: math.nan for k in ("rmse", "abs_rel", "delta1")}
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def box_iou(a: Tensor | np.ndarray, b: Tensor | np.ndarray) -> Tensor:
    """Pairwise IoU ``[n, m]`` of xyxy boxes ``a [n, 4]`` and ``b [m, 4]`` (continuous coords)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    a, b = a.reshape(-1, 4), b.reshape(-1, 4)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp_min(0).prod(-1)
    area = lambda z: (z[:, 2:] - z[:, :2]).clamp_min(0).prod(-1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return torch.where(union > 0, inter / union, torch.zeros_like(inter))


def corloc(
    pred_boxes: Sequence[np.ndarray] | Tensor | np.ndarray,
    gt_boxes: Sequence[np.ndarray | Tensor],
    threshold: float = 0.5,
) -> float:
    """Correct localisation: fraction of images whose predicted box has IoU ≥ ``threshold`` with
    any ground-truth box. Images without ground-truth boxes are left out of the count."""
    hits, n = 0, 0
    for pred, gts in zip(pred_boxes, gt_boxes, strict=True):
        if len(gts) == 0:
            continue
        n += 1
        hits += bool((box_iou(pred, gts) >= threshold).any())
    return hits / n if n else math.nan


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and Student-t confidence half-width over seeds (NaN half-width for one value)."""
    from scipy.stats import t

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    if v.size == 1:
        return float(v[0]), math.nan
    sem = v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(t.ppf(0.5 + level / 2, df=v.size - 1) * sem)
