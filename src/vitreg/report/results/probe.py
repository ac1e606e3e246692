"""``vitreg probe`` results: per condition (base, fixed) and layer, each task's scores over
seeds with the task's yardsticks, and the fixed − base differences with their verdicts. The
data sets, feature caches and task details are described as read (their fields depend on the
data set and the task)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue

from vitreg.report.results.base import Strict

Verdict = Literal["better", "worse", "within noise", "no interval"]


class ProbeYardstick(Strict):
    """A trivial baseline of one probe metric (chance, majority class, mean depth, ...)."""

    name: str
    metric: str
    group: str = "all"
    value: float | None
    description: str


class ProbeScore(Strict):
    """One metric of one feature (and token group) over seeds, with its 95% half-width."""

    feature: str
    group: str
    metric: str
    mean: float | None
    ci95: float | None
    values: list[float | None]
    higher_is_better: bool
    n_test: int
    lrs: list[float]
    vs_yardsticks: dict[str, Verdict] = Field(
        default_factory=dict, description="yardstick name -> the score's verdict against it"
    )


class ProbeLayer(Strict):
    """Every score of one task at one layer, its yardsticks, notes and task details."""

    task: str
    layer: str
    scores: list[ProbeScore]
    notes: list[str]
    info: dict[str, JsonValue] = Field(description="the task's details (classes, ranges, ...)")
    yardsticks: list[ProbeYardstick]


class ProbeDelta(Strict):
    """fixed − base of one score, called better/worse only when the 95% intervals separate."""

    layer: str
    feature: str
    group: str
    metric: str
    delta: float
    verdict: Verdict


class ProbeResults(Strict):
    """``vitreg probe``: scores per condition and layer, and the fixed − base differences."""

    task: str
    description: str = ""
    seeds: list[int] | int
    layers: list[str]
    data: dict[str, JsonValue] = Field(description="the train and test data sets, as described")
    conditions: dict[str, list[ProbeLayer]] = Field(description="condition -> per layer")
    deltas: list[ProbeDelta] = Field(default_factory=list)
    caches: dict[str, dict[str, JsonValue]] = Field(
        default_factory=dict, description="condition/split -> its feature cache"
    )
    fix: dict[str, JsonValue] | None = Field(default=None, description="the fix, as described")
