"""Yardsticks of the probe tasks: what a probe that learned nothing from the features scores
(chance, always the majority class, always the mean depth, always the best constant position,
always the mean pixels, the whole image as the box), computed on the same test split, so every
score can be read against them."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vitreg.core.renamed import renamed
from vitreg.probe.metrics import IGNORE_INDEX, box_iou, depth_metrics, miou
from vitreg.results.probe import ProbeYardstick


def yardstick(
    name: str, metric: str, value: float, description: str, group: str = "all"
) -> ProbeYardstick:
    """One trivial baseline of one metric (and token group): its name, value (None when not
    finite, e.g. no test sample to score) and how it is made."""
    finite = float(value) if math.isfinite(value) else None
    return ProbeYardstick(
        name=name, metric=metric, group=group, value=finite, description=description
    )


def classification(
    y_train: Tensor, y_test: Tensor, k: int, metrics: tuple[str, ...]
) -> list[ProbeYardstick]:
    """Chance (``1/k``, ``5/k``) and always predicting the train split's most frequent classes."""
    counts = torch.bincount(y_train, minlength=k)
    out = []
    for metric in metrics:
        top = 5 if metric == "top5" else 1
        chosen = counts.argsort(descending=True, stable=True)[:top]
        rate = torch.isin(y_test, chosen).float().mean().item()
        how = (
            f"always class {int(chosen[0])}, the train split's most frequent"
            if top == 1
            else f"always the train split's {top} most frequent classes {chosen.tolist()}"
        )
        out += [
            yardstick("chance", metric, min(top / k, 1.0), f"uniform guess over {k} classes"),
            yardstick("majority class", metric, rate, how),
        ]
    return out


def segmentation(y_train: Tensor, y_test: Tensor, k: int) -> list[ProbeYardstick]:
    """mIoU of labelling every pixel with the train split's most frequent class."""
    valid = y_train[y_train != IGNORE_INDEX]
    cls = int(torch.bincount(valid.reshape(-1), minlength=k).argmax()) if len(valid) else 0
    value = miou(torch.full_like(y_test, cls), y_test, k, IGNORE_INDEX)
    text = f"every pixel labelled class {cls}, the train split's most frequent"
    return [yardstick("majority class", "miou", value, text)]


def depth(mean_depth: float, d_test: Tensor) -> list[ProbeYardstick]:
    """Every depth metric of predicting the train split's mean depth at every pixel."""
    values = depth_metrics(torch.full_like(d_test, mean_depth), d_test)
    text = f"every pixel at the train split's mean depth {mean_depth:.3g}"
    return [yardstick("mean depth", m, v, text) for m, v in values.items()]


def position(
    target: Tensor, grid: tuple[int, int], masks: dict[str, Tensor]
) -> list[ProbeYardstick]:
    """Chance top-1 (``1/(h·w)``) and the mean distance of the best constant position."""
    h, w = grid
    rows = torch.arange(h * w)
    r, c = (rows // w).float(), (rows % w).float()
    tr, tc = (target // w).float(), (target % w).float()
    out = []
    for group, mask in masks.items():
        if not mask.any():
            continue
        dist = ((r[:, None] - tr[mask][None]) ** 2 + (c[:, None] - tc[mask][None]) ** 2).sqrt()
        best = dist.mean(1).argmin()
        out += [
            yardstick(
                "chance", "top1", 1 / (h * w), f"uniform guess over {h}×{w} positions", group
            ),
            yardstick(
                "best constant",
                "mean_distance",
                dist[best].mean().item(),
                f"always position (row {int(best) // w}, col {int(best) % w}), the best constant",
                group,
            ),
        ]
    return out


def reconstruction(
    y_train: Tensor, y_test: Tensor, masks: dict[str, Tensor]
) -> list[ProbeYardstick]:
    """MSE of predicting the train tokens' mean pixels for every test token."""
    mse = (y_test.float() - y_train.float().mean(0)).pow(2).mean(-1)
    return [
        yardstick("mean pixels", "mse", mse[m].mean().item(), "always the train mean patch", g)
        for g, m in masks.items()
        if m.any()
    ]


def discovery(gts: list[Tensor], size: tuple[int, int]) -> list[ProbeYardstick]:
    """CorLoc of taking the whole image as the object box."""
    whole = torch.tensor([[0.0, 0.0, float(size[1]), float(size[0])]])
    scored = [bool((box_iou(whole, g) >= 0.5).any()) for g in gts if len(g)]
    value = sum(scored) / len(scored) if scored else math.nan
    return [yardstick("whole image", "corloc", value, "the whole image as the box")]


__getattr__ = renamed(__name__, {"Yardstick": "ProbeYardstick"}, globals())
