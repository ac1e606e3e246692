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
    and the feature pictures (PCA colours, centre-patch similarity)."""
    from vitreg.analysis.attention import AttentionAnalysis
    from vitreg.analysis.feature_pictures import FeaturePictureAnalysis
    from vitreg.analysis.ln_separation import LNAnalysis
    from vitreg.analysis.norms import NormAnalysis
    from vitreg.analysis.redundancy import RedundancyAnalysis

    return [
        NormAnalysis(rules),
        AttentionAnalysis(max_maps=max_maps),
        RedundancyAnalysis(max_maps=max_maps),
        LNAnalysis(),
        FeaturePictureAnalysis(keep=min(max_maps, 4)),
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
        """The ``results`` block of metrics.json (analyses' own ``to_dict``)."""
        sources = sorted(set(self.attn_source.values()))
        return {
            **{name: r.to_dict() for name, r in self.results.items()},
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
    desc = {"n_images": trace.n_images, **(data_description or {})}
    return DiagnoseResult(model.describe(), desc, results, skipped, dict(trace.attn_source))
