"""Probe tasks that score the model's own outputs (CLIP zero-shot logits, [CLS] attention maps)
on the test split, with no feature cache and no trained head: :class:`ModelTask`."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from torch import Tensor

from vitreg.data.datasets import Sample
from vitreg.data.transforms import prepare
from vitreg.errors import InputError
from vitreg.fix.base import Fix
from vitreg.models.model import Model
from vitreg.probe.features import CachedFeatures
from vitreg.probe.linear import FitSettings
from vitreg.probe.tasks.base import Task, TaskResult


class ModelTask(Task):
    """A task that runs the model itself: ``setup`` once, ``outputs`` per batch under each
    condition (bare / fixed), ``score`` on everything a condition produced."""

    scores_model: ClassVar[bool] = True
    views: ClassVar[tuple[str, ...]] = ()
    trains: ClassVar[bool] = False  # also runs over the train split and hands it to fit()

    def evaluate(
        self, train: CachedFeatures, test: CachedFeatures, layer: str, config: FitSettings
    ) -> TaskResult:
        raise InputError(
            f"task {self.name!r} scores the model's own outputs, not cached features; run it "
            "with vitreg.probe.run.run (vitreg probe --task ...)"
        )

    @abstractmethod
    def setup(self, model: Model, dataset: Any, options: dict[str, Any]) -> list[str]:
        """Prepare what does not depend on the fix (e.g. class text embeddings); return notes."""

    def condition(self, fix: Fix | None) -> list[str]:
        """Adjust to the condition about to run (bare: None, else under ``fix``); notes on
        what changed (none, unless a task's settings depend on the fix)."""
        return []

    @abstractmethod
    def layer(self, model: Model) -> str:
        """The name the scores are reported under (a hook name or the embedding)."""

    @abstractmethod
    def outputs(self, model: Model, x: Tensor) -> Tensor:
        """What is kept of one batch of prepared images (one row per image, on the CPU)."""

    def keep(self, targets: Tensor) -> Tensor:
        """What is kept of one batch of targets until scoring (all of it, unless overridden)."""
        return targets

    def prepare(
        self, sample: Sample, config: dict[str, int | list[float]]
    ) -> dict[str, Tensor | str]:
        """One sample as model input and targets (``config``: ``size``, ``mean``, ``std``): the
        short side resized and centre-cropped square, unless a task keeps the aspect. Samples
        are batched while their image and target shapes agree."""
        return prepare(sample, config["size"], config["mean"], config["std"])

    def run_batch(self, model: Model, x: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """``(outputs, kept targets)`` of one batch, both on the CPU; :meth:`score` receives
        them concatenated over the batches."""
        return self.outputs(model, x).float().cpu(), self.keep(targets)

    def fit(self, outputs: Tensor, targets: Tensor) -> None:
        """Learn from the train split's outputs of one condition before its test split is
        scored; only tasks with ``trains`` are given a train split."""
        raise NotImplementedError(f"task {self.name!r} trains nothing")

    @abstractmethod
    def score(self, outputs: Tensor, targets: Tensor, layer: str) -> TaskResult:
        """The scores of one condition from all its ``outputs`` and the matching targets."""
