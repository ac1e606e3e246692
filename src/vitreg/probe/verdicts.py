"""How a probe score reads against the other condition and against the yardsticks: "better" or
"worse" only when the 95% intervals separate, otherwise "within noise" (so a Δ of a few points
with error bars wider than that is never called an improvement)."""

from __future__ import annotations

from typing import TypeVar

from vitreg.core.intervals import interval_verdict
from vitreg.results.probe import ProbeDelta, ProbeLayer, ProbeScore

LayerT = TypeVar("LayerT", bound=ProbeLayer)


def _key(score: ProbeScore) -> tuple[str, str, str]:
    return score.feature, score.group, score.metric


def yardstick_verdicts(layer: LayerT) -> LayerT:
    """A copy of one layer's result whose every score has ``vs_yardsticks``: per yardstick of
    its metric and token group, the score's verdict against it (the yardstick is exact on this
    test split: half-width 0)."""
    scores = [
        score.model_copy(
            update={
                "vs_yardsticks": {
                    y.name: interval_verdict(
                        (y.value, 0.0), (score.mean, score.ci95), score.higher_is_better
                    )
                    for y in layer.yardsticks
                    if y.metric == score.metric
                    and y.group == score.group
                    and y.value is not None
                    and score.mean is not None
                }
            }
        )
        for score in layer.scores
    ]
    return layer.model_copy(update={"scores": scores})


def deltas(conditions: dict[str, list[LayerT]]) -> list[ProbeDelta]:
    """Per layer and score present in both conditions: fixed − base and its verdict."""
    if set(conditions) != {"base", "fixed"}:
        return []
    out = []
    for base_layer, fixed_layer in zip(conditions["base"], conditions["fixed"], strict=True):
        fixed = {_key(s): s for s in fixed_layer.scores}
        for b in base_layer.scores:
            f = fixed.get(_key(b))
            if f is None or b.mean is None or f.mean is None:
                continue
            out.append(
                ProbeDelta(
                    layer=base_layer.layer,
                    feature=b.feature,
                    group=b.group,
                    metric=b.metric,
                    delta=f.mean - b.mean,
                    verdict=interval_verdict(
                        (b.mean, b.ci95), (f.mean, f.ci95), b.higher_is_better
                    ),
                )
            )
    return out
