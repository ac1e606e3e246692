"""Analyses share one streaming pass: each declares its reducers, then summarises them.

``run_analyses`` attaches every analysis' reducers to a single ``Model.trace`` so a diagnose
run costs one forward per image, then calls each ``finish`` in order (later analyses may use
earlier results, e.g. attention/norm agreement uses the norm outliers). Under torchrun the
trace is sharded over the ranks and its reducers merged (see ``Model.trace``), so every rank
finishes the analyses on the statistics of all images and gets the single-process results.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from vitreg.hooks.reducers import Reducer
from vitreg.models.model import Model, TraceResult
from vitreg.progress import Update
from vitreg.results.base import ResultsModel


class Traced:
    """An analysis result that also keeps tensors for figures or later analyses (maps, the norm
    trace): its summary, the block metrics.json holds, is one results model."""

    summary: ResultsModel


#: what an analysis finishes with: its results model, or a :class:`Traced` holder of it
Finished = ResultsModel | Traced


def summary_of(result: Finished) -> ResultsModel:
    """The results model of a finished analysis."""
    return result.summary if isinstance(result, Traced) else result


class Analysis(ABC):
    """One analysis: which statistics it needs and how it turns them into a result."""

    name: ClassVar[str]

    def not_applicable(self, model: Model) -> str | None:
        """Why this analysis does not apply to ``model`` (``None``: it applies)."""
        return None

    @abstractmethod
    def reducers(self, model: Model) -> list[Reducer]:
        """Fresh reducers for one pass over the data."""

    @abstractmethod
    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> Finished:
        """Summarise this analysis' reducers (found in ``trace``); ``done`` holds earlier results."""


def run_analyses(
    model: Model,
    data: Any,
    analyses: Sequence[Analysis],
    batch_size: int = 32,
    limit: int | None = None,
    progress: Update | None = None,
    attention: str = "auto",
) -> tuple[dict[str, Finished], dict[str, str], TraceResult]:
    """One pass for all ``analyses``: returns (results, not-applicable reasons, the trace)."""
    skipped = {a.name: r for a in analyses if (r := a.not_applicable(model)) is not None}
    active = [a for a in analyses if a.name not in skipped]
    owned: dict[str, list[Reducer]] = {a.name: a.reducers(model) for a in active}
    everything = [r for rs in owned.values() for r in rs]
    trace = model.trace(
        data, everything, batch_size=batch_size, limit=limit, progress=progress, attention=attention
    )
    results: dict[str, Finished] = {}
    for a in active:
        own = TraceResult(owned[a.name], trace.n_images, trace.layouts, trace.attn_source)
        results[a.name] = a.finish(model, own, results)
    return results, skipped, trace
