"""What single patch tokens know about their own patch: its position in the grid and its pixels,
scored separately for normal and outlier tokens (Darcet et al. §3, the reassessment's probes)."""

from __future__ import annotations

import math
from abc import abstractmethod

import torch
from torch import Tensor

from vitreg.probe import yardsticks
from vitreg.probe.features import CachedFeatures
from vitreg.probe.linear import FitResult, FitSettings
from vitreg.probe.tasks.base import (
    Task,
    TaskResult,
    outlier_threshold,
    probe_scores,
    register_task,
    seeded_rows,
)
from vitreg.results.probe import ProbeYardstick, TaskInfo

MAX_TRAIN_TOKENS = 100_000  # tokens drawn for training (seeded); the test split is used whole


def token_rows(
    cache: CachedFeatures, layer: str, limit: int | None, seed: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(tokens [m, C], their rows in the flattened [n·N] token list, patch norms [m]) of the
    patch tokens, ``limit`` of them drawn."""
    patches = cache.get("patches", layer)
    rows = seeded_rows(patches.shape[0] * patches.shape[1], limit, seed)
    return (
        patches.flatten(0, 1)[rows],
        rows,
        cache.get("patch_norms", layer).reshape(-1)[rows],
    )


def groups(norms: Tensor, threshold: float) -> dict[str, Tensor]:
    """Token masks of the groups scored: all, normal and outlier (when the layer has outliers)."""
    outlier = norms > threshold
    out = {"all": torch.ones_like(outlier), "normal": ~outlier}
    if math.isfinite(threshold):
        out["outlier"] = outlier
    return out


class LocalInfoTask(Task):
    """Shared flow of the token-level regressions: train on (sampled) train tokens of every kind,
    score each token group of the test split."""

    views = ("patches",)
    target = None
    token_level = True

    @abstractmethod
    def fit_args(self, cache: CachedFeatures, layer: str, rows: Tensor) -> tuple:
        """(targets, loss name, loss kwargs) of the tokens at ``rows`` of the flattened list."""

    @abstractmethod
    def measure(self, pred: Tensor, target: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
        """Per-token metric values of predictions ``pred`` for ``target``."""

    @abstractmethod
    def baselines(
        self, y_train: Tensor, y_test: Tensor, grid: tuple[int, int], masks: dict[str, Tensor]
    ) -> list[ProbeYardstick]:
        """The task's trivial baselines on the test tokens, per token group."""

    def evaluate(
        self, train: CachedFeatures, test: CachedFeatures, layer: str, config: FitSettings
    ) -> TaskResult:
        x_tr, rows_tr, _ = token_rows(train, layer, MAX_TRAIN_TOKENS, seed=0)
        x_te, rows_te, norms_te = token_rows(test, layer, None, seed=0)
        threshold, fit = outlier_threshold(train.get("patch_norms", layer))
        masks = groups(norms_te, threshold)
        y_tr, loss, kw = self.fit_args(train, layer, rows_tr)
        y_te, _, _ = self.fit_args(test, layer, rows_te)
        grid = tuple(train.layout[layer].grid)

        def evaluate(fit_: FitResult) -> dict[str, float]:
            per_token = self.measure(fit_.head.predict(x_te), y_te, grid)
            return {
                f"{metric}/{group}": values[mask].float().mean().item() if mask.any() else math.nan
                for metric, values in per_token.items()
                for group, mask in masks.items()
            }

        sizes = {g: int(m.sum()) for g, m in masks.items()}
        scores = probe_scores(
            "patch_token", x_tr, y_tr, loss, evaluate, self.metrics, config, len(x_te), sizes, **kw
        )
        notes = [] if "outlier" in masks else ["no outlier mode at this layer: only normal tokens"]
        marks = self.baselines(y_tr, y_te, grid, masks)
        info = TaskInfo(
            outlier_threshold=threshold, bimodal_fit=fit, tokens=sizes, train_tokens=len(x_tr)
        )
        return TaskResult(self.name, layer, scores, notes, info, marks)


@register_task
class PositionTask(LocalInfoTask):
    name = "position"
    description = "linear probe: patch token → its grid position (CE + 0.5·MSE on (row, col))"
    metrics = {"top1": True, "mean_distance": False}

    def fit_args(self, cache: CachedFeatures, layer: str, rows: Tensor) -> tuple:
        grid = tuple(cache.layout[layer].grid)
        return rows % (grid[0] * grid[1]), "position", {"grid": grid}

    def measure(self, pred: Tensor, target: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
        return {"top1": (pred == target).float(), "mean_distance": distance(pred, target, grid[1])}

    def baselines(
        self, y_train: Tensor, y_test: Tensor, grid: tuple[int, int], masks: dict[str, Tensor]
    ) -> list[ProbeYardstick]:
        return yardsticks.position(y_test, grid, masks)


def distance(pred: Tensor, target: Tensor, width: int) -> Tensor:
    """Euclidean distance in patches between predicted and true grid positions."""
    dr = (pred // width - target // width).float()
    dc = (pred % width - target % width).float()
    return (dr * dr + dc * dc).sqrt()


@register_task
class ReconstructionTask(LocalInfoTask):
    name = "reconstruction"
    description = "linear decoder: patch token → its normalised pixels; MSE"
    metrics = {"mse": False}
    pixels = True

    def fit_args(self, cache: CachedFeatures, layer: str, rows: Tensor) -> tuple:
        return cache.get("pixels", layer).flatten(0, 1)[rows], "mse", {}

    def measure(self, pred: Tensor, target: Tensor, grid: tuple[int, int]) -> dict[str, Tensor]:
        return {"mse": (pred - target).pow(2).mean(-1)}

    def baselines(
        self, y_train: Tensor, y_test: Tensor, grid: tuple[int, int], masks: dict[str, Tensor]
    ) -> list[ProbeYardstick]:
        return yardsticks.reconstruction(y_train, y_test, masks)
