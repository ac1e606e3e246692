"""``diagnose``: every artifact analysis in one streaming pass over the images."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vitreg.analysis.base import Analysis, run_analyses
from vitreg.models.model import Model
from vitreg.progress import Update


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
    """All analyses of one model on one image set, plus what did not apply and why."""

    model: dict[str, Any]
    data: dict[str, Any]
    results: dict[str, Any]
    not_applicable: dict[str, str] = field(default_factory=dict)
    attn_source: dict[str, str] = field(default_factory=dict)

    @property
    def verdict(self) -> bool:
        return bool(self.results["norms"].report.verdict)

    def to_dict(self) -> dict[str, Any]:
        """The ``results`` block of metrics.json (analyses' own ``to_dict``; the per-kind
        verdict first)."""
        sources = sorted(set(self.attn_source.values()))
        first = sorted(self.results, key=lambda name: name != "kinds")
        return {
            **{name: self.results[name].to_dict() for name in first},
            "not_applicable": dict(self.not_applicable),
            "attention_source": sources[0] if len(sources) == 1 else sources,
        }


def diagnose(
    model: Model,
    data: Any,
    *,
    data_description: dict[str, Any] | None = None,
    rules: dict[str, dict[str, float]] | None = None,
    analyses: list[Analysis] | None = None,
    batch_size: int = 32,
    limit: int | None = None,
    max_maps: int = 8,
    progress: Update | None = None,
) -> DiagnoseResult:
    """Run the artifact analyses on ``data`` (tensor, DataLoader or iterable of batches).

    ``max_maps`` bounds how many images keep full per-layer maps for figures; statistics use
    every image.
    """
    chosen = analyses if analyses is not None else default_analyses(rules, max_maps)
    results, skipped, trace = run_analyses(
        model, data, chosen, batch_size=batch_size, limit=limit, progress=progress
    )
    if "norms" in results:  # the per-kind verdict reads what ran and why the rest did not
        from vitreg.analysis.kinds import verdicts

        results["kinds"] = verdicts(results, skipped)
    desc = {"n_images": trace.n_images, **(data_description or {})}
    return DiagnoseResult(model.describe(), desc, results, skipped, dict(trace.attn_source))
