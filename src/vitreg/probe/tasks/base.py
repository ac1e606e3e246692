"""What a probe task is (lm-eval style): the views and targets it needs, the metrics it reports
and which way they point, and how it scores cached train/test features."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar

import torch
from pydantic import PrivateAttr
from torch import Tensor

from vitreg.core.registry import Registry
from vitreg.core.renamed import renamed
from vitreg.errors import InputError, SpecError
from vitreg.probe.features import CachedFeatures
from vitreg.probe.linear import FitResult, FitSettings, fit_seeds
from vitreg.probe.metrics import mean_ci
from vitreg.results.diagnose import Bimodal
from vitreg.results.probe import ProbeLayer, ProbeScore, ProbeYardstick, TaskInfo


def score_over_seeds(
    feature: str,
    metric: str,
    values: list[float],
    higher_is_better: bool,
    group: str = "all",
    n_test: int = 0,
    lrs: list[float] | None = None,
) -> ProbeScore:
    """One metric of one feature (optionally of one token ``group``, e.g. "normal"/"outlier"
    tokens) over seeds: its mean and 95% half-width (None where not finite)."""
    mean, ci = mean_ci(values) if values else (math.nan, math.nan)
    return ProbeScore(
        feature=feature,
        group=group,
        metric=metric,
        mean=_finite(mean),
        ci95=_finite(ci),
        values=[_finite(v) for v in values],
        higher_is_better=higher_is_better,
        n_test=n_test,
        lrs=list(lrs or []),
    )


class TaskResult(ProbeLayer):
    """Every score of one task at one layer, its yardsticks (trivial baselines), what was
    skipped and why, and the task's details; ``examples`` holds a few test predictions for
    figures (not in the file)."""

    _examples: dict[str, Tensor] = PrivateAttr(default_factory=dict)

    def __init__(
        self,
        task: str,
        layer: str,
        scores: list[ProbeScore],
        notes: list[str] | None = None,
        info: TaskInfo | None = None,
        yardsticks: list[ProbeYardstick] | None = None,
        examples: dict[str, Tensor] | None = None,
    ) -> None:
        super().__init__(
            task=task,
            layer=layer,
            scores=scores,
            notes=list(notes or []),
            info=info if info is not None else TaskInfo(),
            yardsticks=list(yardsticks or []),
        )
        self._examples = dict(examples or {})

    @property
    def examples(self) -> dict[str, Tensor]:
        """A few test predictions and their targets, for the figures."""
        return self._examples


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


class Task(ABC):
    """A probe: ``evaluate(train, test, layer, config)`` on features cached by ``extract``."""

    name: ClassVar[str]
    description: ClassVar[str]
    target: ClassVar[str | None]  # dataset target the task needs ("label", "mask", ...)
    views: ClassVar[tuple[str, ...]]  # cache views to extract
    metrics: ClassVar[dict[str, bool]]  # metric -> higher is better
    pixels: ClassVar[bool] = False
    token_level: ClassVar[bool] = False  # also runs on stage tokens of Swin / PVT

    def check(self, targets: tuple[str, ...], spec: str) -> None:
        """Fail early when the dataset lacks this task's target."""
        if self.target is not None and self.target not in targets:
            raise InputError(
                f"task {self.name!r} needs {self.target!r} targets and {spec} provides "
                f"{list(targets) or 'none'}; use a dataset with {self.target}s (see `vitreg probe --help`)"
            )

    @abstractmethod
    def evaluate(
        self, train: CachedFeatures, test: CachedFeatures, layer: str, config: FitSettings
    ) -> TaskResult:
        """Scores of this task at ``layer`` (a cached hook name)."""


TASKS: Registry[type[Task]] = Registry("tasks", modules=("vitreg.probe.tasks",))


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make a task available by its ``name`` in :data:`TASKS`."""
    return TASKS.register(cls.name, cls)


def get_task(name: str) -> Task:
    """The task called ``name`` (a SpecError lists the known ones)."""
    if name not in TASKS:
        raise SpecError(f"unknown probe task {name!r}; choose from {', '.join(sorted(TASKS))}")
    return TASKS[name]()


# helpers shared by the tasks ------------------------------------------------------------------
def available(cache: CachedFeatures, view: str, layer: str) -> bool:
    """Whether ``view`` exists at ``layer`` (absent views: no [CLS], no registers, no fix)."""
    return view not in cache.manifest.absent.get(layer, {})


def num_classes(cache: CachedFeatures, labels: Tensor) -> int:
    """The dataset's class count (or, failing that, one more than the largest label)."""
    n = cache.manifest.dataset.get("num_classes")
    return int(n) if n else int(labels.max()) + 1


def outlier_threshold(train_norms: Tensor) -> tuple[float, Bimodal]:
    """The norm above which a patch is an outlier at this layer, from the train patches'
    bimodal fit (``inf`` when the norms show no outlier mode)."""
    from vitreg.analysis.thresholds import bimodal_fit

    fit = bimodal_fit(train_norms.reshape(-1).double().numpy())
    return fit.cut, fit


def seeded_rows(n: int, k: int | None, seed: int) -> Tensor:
    """``k`` of ``n`` row indices drawn without replacement (all rows when ``k`` is None/≥ n)."""
    if k is None or k >= n:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:k].sort().values


def probe_scores(
    feature: str,
    x_train: Tensor,
    y_train: Tensor,
    loss: str,
    evaluate: Callable[[FitResult], Mapping[str, float]],
    metrics: dict[str, bool],
    config: FitSettings,
    n_test: int,
    groups: Mapping[str, int] | None = None,
    **kw: Any,
) -> list[ProbeScore]:
    """Fit one linear probe per seed and turn ``evaluate``'s metrics into Scores.

    ``evaluate`` may return keys ``metric`` or ``metric/group``; ``groups`` maps a group to the
    n_test it was scored on (defaults to ``n_test``)."""
    named = replace(config, label=feature)  # the progress lines name the feature
    runs = fit_seeds(x_train, y_train, loss, evaluate, config=named, **kw)
    scores = []
    for key, values in runs.values.items():
        metric, _, group = key.partition("/")
        scores.append(
            score_over_seeds(
                feature,
                metric,
                values,
                metrics[metric],
                group or "all",
                int((groups or {}).get(group, n_test)),
                runs.lrs,
            )
        )
    return scores


__getattr__ = renamed(__name__, {"Score": "ProbeScore"}, globals())
