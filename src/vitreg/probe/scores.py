"""What a probe run returns: scores per condition and layer, and the record of its data.

Shared by the cached-feature runner (:mod:`vitreg.probe.run`) and the zero-shot runner
(:mod:`vitreg.probe.zero_shot.runner`), which both return a :class:`ProbeScores`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vitreg.data.datasets import DataLog, LabeledDataset
from vitreg.probe.tasks import TaskResult
from vitreg.probe.verdicts import deltas, yardstick_verdicts


@dataclass
class ProbeScores:
    """Scores per condition ("base", "fixed") and layer, plus what produced them."""

    task: str
    model: dict[str, Any]
    data: dict[str, Any]
    layers: list[str]
    results: dict[str, list[TaskResult]]
    caches: dict[str, dict[str, Any]] = field(default_factory=dict)
    fix: dict[str, Any] | None = None
    description: str = ""
    seeds: list[int] = field(default_factory=list)
    images: dict[str, Any] = field(default_factory=dict, repr=False)  # for figures only

    def to_dict(self) -> dict[str, Any]:
        """The results block: scores with their verdicts against the yardsticks, and the
        fixed − base differences with theirs."""
        conditions = {c: [r.to_dict() for r in rs] for c, rs in self.results.items()}
        for layer in (layer for rs in conditions.values() for layer in rs):
            yardstick_verdicts(layer)
        return {
            "task": self.task,
            "description": self.description,
            "seeds": self.seeds,
            "layers": self.layers,
            "data": self.data,
            "conditions": conditions,
            "deltas": deltas(conditions),
            "caches": self.caches,
            "fix": self.fix,
        }


def data_record(ds: LabeledDataset, cache: dict[str, Any]) -> dict[str, Any]:
    """The dataset's identity and its counted bad input, read from the cache manifest: samples
    skipped and pixels repaired by reason (the extraction, not ``ds.log``, saw them, and a reused
    cache reads no sample at all); ``listing``: entries the folder listing did not take as
    samples (hidden, not an image, FIFO, dangling link, ...), all ``ds.log`` holds outside the
    extraction."""
    log = dict(sorted({**cache["skipped"], **cache["repairs"]}.items()))
    listing = ds.log.to_dict() if isinstance(getattr(ds, "log", None), DataLog) else {}
    return ds.describe() | {"log": log} | ({"listing": listing} if listing else {})
