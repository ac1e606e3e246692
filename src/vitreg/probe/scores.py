"""What a probe run returns: its typed results (scores per condition and layer with their
verdicts, the fixed − base differences, the data and caches), and what only its figures read.

Shared by the cached-feature runner (:mod:`vitreg.probe.run`) and the zero-shot runner
(:mod:`vitreg.probe.zero_shot.runner`), which both return a :class:`ProbeScores`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter

from vitreg.data.datasets import DataLog, LabeledDataset
from vitreg.fix.base import Fix, fix_description
from vitreg.probe.tasks import TaskResult
from vitreg.probe.verdicts import deltas, yardstick_verdicts
from vitreg.results.fix import FixDescription
from vitreg.results.probe import DataSetRecord, FeatureCache, ProbeData, ProbeResults
from vitreg.results.schema import ModelDescription, plain


@dataclass
class ProbeScores:
    """A probe run: ``results`` (what metrics.json holds; its layers are the tasks'
    :class:`~vitreg.probe.tasks.TaskResult` with their example predictions), the probed
    model's description, and a few test images for the figures."""

    results: ProbeResults
    model: ModelDescription
    images: dict[str, Any] = field(default_factory=dict, repr=False)  # for figures only


def probe_results(
    task: str,
    data: ProbeData,
    layers: list[str],
    results: dict[str, list[TaskResult]],
    caches: dict[str, FeatureCache],
    fix: FixDescription | None = None,
    description: str = "",
    seeds: list[int] | None = None,
) -> ProbeResults:
    """The results of a probe run: the tasks' scores per condition and layer with their
    verdicts against the yardsticks, and the fixed − base differences with theirs."""
    conditions = {c: [yardstick_verdicts(r) for r in rs] for c, rs in results.items()}
    return ProbeResults(
        task=task,
        description=description,
        seeds=list(seeds or []),
        layers=layers,
        data=data,
        conditions=conditions,  # type: ignore[arg-type]  # TaskResult is a ProbeLayer
        deltas=deltas(conditions),
        caches=caches,
        fix=fix,
    )


def fix_record(fix: Fix) -> FixDescription:
    """A fix as the results record it (its class name, then what its ``describe()`` says)."""
    return TypeAdapter(FixDescription).validate_python(plain(fix_description(fix)))


def data_record(
    ds: LabeledDataset, skipped: dict[str, int], repairs: dict[str, int]
) -> DataSetRecord:
    """The dataset's identity and its counted bad input, as the extraction saw it (``skipped``
    samples and ``repairs`` of pixels by reason, from the cache manifest: a reused cache reads
    no sample at all); ``listing``: entries the folder listing did not take as samples
    (hidden, not an image, FIFO, dangling link, ...), all ``ds.log`` holds outside the
    extraction."""
    log = dict(sorted({**skipped, **repairs}.items()))
    listing = ds.log.to_dict() if isinstance(getattr(ds, "log", None), DataLog) else {}
    record = ds.describe() | {"log": log} | ({"listing": listing} if listing else {})
    return DataSetRecord.model_validate(plain(record))
