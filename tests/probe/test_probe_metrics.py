"""Probe metrics against independent numpy computations on tiny hand-made cases."""

import math

import numpy as np
import pytest
import torch

from vitreg.probe.metrics import (
    METRICS,
    box_iou,
    corloc,
    depth_metrics,
    mean_ci,
    miou,
    per_class_iou,
    topk_accuracy,
)


def test_topk_accuracy() -> None:
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.3], [0.2, 0.3, 0.5]])
    y = torch.tensor([1, 2, 0])
    assert topk_accuracy(logits, y, 1) == pytest.approx(1 / 3)
    assert topk_accuracy(logits, y, 2) == pytest.approx(2 / 3)
    assert topk_accuracy(logits, y, 5) == 1.0  # k capped at the number of classes


# 2 images, 4 classes; 255 = ignore; class 3 never appears (excluded from the mean).
PRED = np.array([[[0, 0, 1], [1, 2, 2]], [[0, 1, 1], [2, 2, 0]]])
GT = np.array([[[0, 1, 1], [255, 2, 2]], [[0, 0, 1], [2, 255, 255]]])


def numpy_iou(pred: np.ndarray, gt: np.ndarray, k: int) -> np.ndarray:
    keep = gt != 255
    p, g = pred[keep], gt[keep]
    out = np.full(k, np.nan)
    for c in range(k):
        inter = np.sum((p == c) & (g == c))
        union = np.sum((p == c) | (g == c))
        if union:
            out[c] = inter / union
    return out


def test_miou_matches_numpy_with_ignore_pixels() -> None:
    expected = numpy_iou(PRED, GT, 4)
    # by hand: class 0: inter 2 / union 4; class 1: 2/4; class 2: 3/3 (ignored pred-2 pixels drop out)
    np.testing.assert_allclose(expected[:3], [0.5, 0.5, 1.0])
    assert miou(torch.tensor(PRED), torch.tensor(GT), 4) == pytest.approx(np.nanmean(expected))
    per = per_class_iou(torch.tensor(PRED), torch.tensor(GT), 4).numpy()
    np.testing.assert_allclose(per, expected, equal_nan=True)


NAN = float("nan")
DEPTH_GT = np.array([[[1.0, 2.0], [NAN, 4.0]], [[0.0, 2.0], [3.0, 5.0]]], dtype=np.float32)
DEPTH_PRED = np.array([[[1.1, 2.5], [9.0, 3.0]], [[7.0, 2.0], [3.3, 5.5]]], dtype=np.float32)


def numpy_depth(pred: np.ndarray, gt: np.ndarray) -> dict[str, float]:
    valid = np.isfinite(gt) & (gt > 0)
    p, g = pred[valid].astype(np.float64), gt[valid].astype(np.float64)
    return {
        "rmse": float(np.sqrt(np.mean((p - g) ** 2))),
        "abs_rel": float(np.mean(np.abs(p - g) / g)),
        "delta1": float(np.mean(np.maximum(p / g, g / p) < 1.25)),
    }


def test_depth_metrics_match_numpy_over_valid_pixels() -> None:
    pred, gt = torch.tensor(DEPTH_PRED), torch.tensor(DEPTH_GT)
    pooled = depth_metrics(pred, gt, per_image=False)
    assert pooled == pytest.approx(numpy_depth(DEPTH_PRED, DEPTH_GT))
    per = [numpy_depth(DEPTH_PRED[i], DEPTH_GT[i]) for i in range(2)]
    expected = {k: (per[0][k] + per[1][k]) / 2 for k in per[0]}
    assert depth_metrics(pred, gt) == pytest.approx(expected)
    # the invalid pixels (NaN, 0) carry huge errors: including them would change rmse
    assert pooled["rmse"] < 1.0
    capped = depth_metrics(pred, gt, max_depth=4.5, per_image=False)
    gt_capped = np.where(DEPTH_GT <= 4.5, DEPTH_GT, np.nan)
    assert capped == pytest.approx(numpy_depth(DEPTH_PRED, gt_capped))


def test_box_iou_and_corloc() -> None:
    iou = box_iou(np.array([[0, 0, 2, 2]]), np.array([[1, 1, 3, 3], [0, 0, 2, 2], [5, 5, 6, 6]]))
    np.testing.assert_allclose(iou.numpy(), [[1 / 7, 1.0, 0.0]])
    preds = [
        np.array([0, 0, 10, 10]),
        np.array([0, 0, 10, 10]),
        np.array([0, 0, 4, 4]),
        np.array([1, 1, 2, 2]),
    ]
    gts = [
        np.array([[50, 50, 60, 60], [0, 0, 10, 12]]),  # second box: IoU 100/120 ≥ 0.5 → hit
        np.array([[5, 0, 15, 10]]),  # IoU 50/150 → miss
        np.array([[0, 0, 4, 8]]),  # IoU 0.5 exactly → hit
        np.zeros((0, 4)),  # no ground truth: not counted
    ]
    assert corloc(preds, gts) == pytest.approx(2 / 3)


def test_metric_directions() -> None:
    assert METRICS["top1"] and METRICS["miou"] and METRICS["delta1"] and METRICS["corloc"]
    assert not METRICS["rmse"] and not METRICS["abs_rel"] and not METRICS["mse"]


def test_mean_ci_known_values() -> None:
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.302652729911275 / math.sqrt(3))  # t(0.975, 2) · s/√n, s = 1
    mean, half = mean_ci([0.5, 0.5, 0.5, 0.5])
    assert (mean, half) == (0.5, 0.0)
    assert math.isnan(mean_ci([0.7])[1])
