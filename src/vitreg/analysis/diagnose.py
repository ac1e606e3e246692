"""``diagnose``: every artifact analysis in one streaming pass over the images."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from vitreg.analysis.base import Analysis, Finished, Traced, run_analyses, summary_of
from vitreg.errors import InputError, UnsupportedModelError
from vitreg.models.model import Model
from vitreg.progress import Update
from vitreg.results.diagnose import DiagnoseResults
from vitreg.results.kinds import Sinks
from vitreg.results.schema import DataInfo, ModelDescription, data_info


def default_analyses(
    rules: dict[str, dict[str, float]] | None = None, max_maps: int = 8
) -> list[Analysis]:
    """Norms/outliers first (the others use its outlier masks), then attention, redundancy, LN,
    the feature pictures (PCA colours, centre-patch similarity), and the other kinds of artifact:
    sinks, massive activations, LOF anomaly tokens, position-tied artifacts, registers (last:
    it reads the four before it)."""
    from vitreg.analysis.anomaly_lof import LOFAnalysis
    from vitreg.analysis.attention import AttentionAnalysis
    from vitreg.analysis.feature_pictures import FeaturePictureAnalysis
    from vitreg.analysis.ln_separation import LNAnalysis
    from vitreg.analysis.massive import MassiveAnalysis
    from vitreg.analysis.norms import NormAnalysis
    from vitreg.analysis.positions import PositionAnalysis
    from vitreg.analysis.redundancy import RedundancyAnalysis
    from vitreg.analysis.registers import RegisterAnalysis
    from vitreg.analysis.sinks import SinkAnalysis

    return [
        NormAnalysis(rules),
        AttentionAnalysis(max_maps=max_maps),
        RedundancyAnalysis(max_maps=max_maps),
        LNAnalysis(),
        FeaturePictureAnalysis(keep=min(max_maps, 4)),
        SinkAnalysis(),
        MassiveAnalysis(),
        LOFAnalysis(),
        PositionAnalysis(),
        RegisterAnalysis(),
    ]


@dataclass
class DiagnoseResult:
    """All analyses of one model on one image set: ``results``, the typed block metrics.json
    holds (what did not apply and why included), and ``traced``, the tensors behind the figures
    (the norm trace, attention and redundancy maps, patch features) by analysis."""

    model: ModelDescription
    data: DataInfo  # the images' description, with n_images: metrics.json's data block
    results: DiagnoseResults
    traced: dict[str, Traced] = field(default_factory=dict)

    @property
    def verdict(self) -> bool:
        return self.results.norms.artifacts_present


def typed_results(
    found: dict[str, Finished], skipped: dict[str, str], attn_source: dict[str, str]
) -> DiagnoseResults:
    """The results model of what the analyses ``found`` (``skipped``: why the others did not
    run; ``attn_source``: how each attention site's pattern was read)."""
    sources = sorted(set(attn_source.values()))
    return DiagnoseResults(
        **{name: summary_of(result) for name, result in found.items()},
        not_applicable=dict(skipped),
        attention_source=sources[0] if len(sources) == 1 else sources,
    )


def data_block(n_images: int, description: DataInfo | None) -> DataInfo:
    """The images of a run: ``description`` as given, or only the ``n_images`` traced. A plain
    dict still works for one release (with a ``DeprecationWarning``), its count by default
    ``n_images``."""
    if description is None:
        return DataInfo(n_images=n_images)
    if isinstance(description, DataInfo):
        return description
    warnings.warn(
        "diagnose(data_description=...) takes a vitreg.results.schema.DataInfo; a dict goes in "
        "the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return data_info({"n_images": n_images, **description})


def with_control(
    model: Model,
    data: Any,
    found: dict[str, Finished],
    skipped: dict[str, str],
    batch_size: int,
    limit: int | None,
) -> Sinks:
    """The sink result with the masking control on its sink heads added."""
    from vitreg.analysis.sink_control import sink_control

    sinks = found.get("sinks")
    if not isinstance(sinks, Sinks):
        why = skipped.get("sinks", "the sink analysis did not run")
        raise UnsupportedModelError(f"the sink control needs the sink analysis: {why}")
    heads = [(h.block, h.head) for h in sinks.heads]
    control = sink_control(model, data, heads, batch_size=batch_size, limit=limit)
    return sinks.model_copy(update={"control": control})


def diagnose(
    model: Model,
    data: Any,
    *,
    data_description: DataInfo | None = None,
    rules: dict[str, dict[str, float]] | None = None,
    analyses: list[Analysis] | None = None,
    batch_size: int = 32,
    limit: int | None = None,
    max_maps: int = 8,
    progress: Update | None = None,
    sink_control: bool = False,
) -> DiagnoseResult:
    """Run the artifact analyses on ``data`` (tensor, DataLoader or iterable of batches).

    ``max_maps`` bounds how many images keep full per-layer maps for figures; statistics use
    every image. ``analyses`` must include the norms (:class:`NormAnalysis`): the verdict and
    the per-kind verdict are read from them. ``data_description``: what the images are (by
    default only how many were traced). ``sink_control``: also run the sink-vs-random masking
    control on the sink heads (:mod:`vitreg.analysis.sink_control`; four more passes).
    """
    chosen = analyses if analyses is not None else default_analyses(rules, max_maps)
    if not any(a.name == "norms" for a in chosen):
        raise InputError(
            "diagnose needs the norm analysis, which gives the verdict: add NormAnalysis() to "
            "analyses (or call run_analyses for the others alone)"
        )
    found, skipped, trace = run_analyses(
        model, data, chosen, batch_size=batch_size, limit=limit, progress=progress
    )
    if sink_control:
        found["sinks"] = with_control(model, data, found, skipped, batch_size, limit)
    from vitreg.analysis.kinds import verdicts

    found["kinds"] = verdicts(found, skipped)  # reads what ran and why the rest did not
    desc = data_block(trace.n_images, data_description)
    traced = {name: r for name, r in found.items() if isinstance(r, Traced)}
    results = typed_results(found, skipped, trace.attn_source)
    return DiagnoseResult(model.describe(), desc, results, traced)
