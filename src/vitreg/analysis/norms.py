"""Token norms per layer and token type, outliers by every rule, emergence layer and verdict.

Norms are taken on the residual stream (each block's output, before any final LayerNorm) and,
separately, after the final norm, where outliers can vanish (facebookresearch/dinov2#373). Outlier rules
run on patch tokens; [CLS], registers and inserted tokens are summarised on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vitreg.analysis.base import Analysis, run_analyses
from vitreg.analysis.rules import SET_RULES as METHODS
from vitreg.analysis.rules import threshold
from vitreg.analysis.thresholds import BimodalFit, bimodal_fit
from vitreg.core.layout import TokenLayout
from vitreg.hooks.reducers import Reducer, TokenNorms
from vitreg.models.model import Model, TraceResult
from vitreg.progress import Update

QUANTILES = (0.01, 0.25, 0.5, 0.75, 0.98, 0.99, 1.0)
DEFAULT_RULES: dict[str, dict[str, float]] = {
    "top_p": {"p": 2.0},
    "robust_z": {"z": 3.5},
    "auto": {},
}


@dataclass
class NormTrace:
    """Per-image, per-token norms at every block output (and after the final norm)."""

    sites: list[str]  # block-output sites in forward order
    norms: dict[str, torch.Tensor]  # site -> [n_images, N] float32
    layouts: dict[str, TokenLayout]
    final_site: str | None
    n_images: int

    def patch_norms(self, site: str) -> torch.Tensor:
        """``[n_images, n_patches]`` norms of patch tokens at ``site``."""
        return self.layouts[site].take(self.norms[site], "patches")

    def patch_maps(self, site: str) -> torch.Tensor:
        """``[n_images, h, w]`` norm maps of patch tokens at ``site``."""
        return self.layouts[site].patch_grid(self.norms[site])


def norm_sites(model: Model) -> tuple[list[str], str | None]:
    """Block-output sites in forward order and the post-final-norm site (if the model has one)."""
    names = model.hook_names()
    sites = [n for n in names if n.endswith("hook_resid_post")]
    return sites, ("ln_final.hook_out" if "ln_final.hook_out" in names else None)


def norm_report(
    model: Model,
    data: Any,
    batch_size: int = 32,
    limit: int | None = None,
    progress: Update | None = None,
) -> NormsResult:
    """Stream ``data`` once, keeping only per-token norms at each block output and the final
    norm; the trace and its outlier report (computed once)."""
    results, _, _ = run_analyses(model, data, [NormAnalysis()], batch_size, limit, progress)
    return results["norms"]


@dataclass
class LayerOutliers:
    """Outlier statistics of patch tokens at one site, by every rule."""

    site: str
    layer: int | None
    quantiles: dict[str, float]
    by_type: dict[str, float]  # mean norm of cls / register / extra / patch tokens
    bimodal: BimodalFit
    thresholds: dict[str, float]
    rates: dict[str, float]

    @property
    def present(self) -> bool:
        return self.bimodal.present

    def to_dict(self) -> dict:
        return {
            "site": self.site,
            "layer": self.layer,
            "quantiles": self.quantiles,
            "mean_norm_by_type": self.by_type,
            "bimodal": self.bimodal.to_dict(),
            "thresholds": {k: _finite(v) for k, v in self.thresholds.items()},
            "outlier_rate": self.rates,
            "artifacts_present": self.present,
            "p98_over_median": self.quantiles["p98"] / max(self.quantiles["p50"], 1e-12),
            "max_over_median": self.quantiles["max"] / max(self.quantiles["p50"], 1e-12),
        }


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def layer_outliers(
    trace: NormTrace, site: str, rules: dict[str, dict[str, float]], layer: int | None
) -> LayerOutliers:
    patch = trace.patch_norms(site).numpy().ravel()
    qs = np.quantile(patch, QUANTILES) if patch.size else np.zeros(len(QUANTILES))
    names = ["p1", "p25", "p50", "p75", "p98", "p99", "max"]
    lay = trace.layouts[site]
    by_type = {}
    for kind, sl in (
        ("cls", lay.cls),
        ("register", lay.registers),
        ("extra", lay.extra),
        ("patch", lay.patches),
    ):
        if sl.stop > sl.start:
            by_type[kind] = float(trace.norms[site][:, sl].mean())
    fit = bimodal_fit(patch)
    thresholds = {}
    for method, params in rules.items():
        thresholds[method] = (
            fit.threshold if method == "auto" else threshold(patch, method, **params)
        )
    rates = {m: float((patch > t).mean()) if patch.size else 0.0 for m, t in thresholds.items()}
    return LayerOutliers(
        site, layer, dict(zip(names, map(float, qs), strict=True)), by_type, fit, thresholds, rates
    )


@dataclass
class OutlierReport:
    """Per-layer outlier statistics, the post-final-norm view, the emergence layer and the verdict."""

    layers: list[LayerOutliers]
    final_norm: LayerOutliers | None
    rules: dict[str, dict[str, float]]
    emergence_layer: int | None
    verdict: bool
    evidence: dict[str, Any] = field(default_factory=dict)

    def masks(self, trace: NormTrace, site: str, method: str = "auto") -> torch.Tensor:
        """``[n_images, h, w]`` bool outlier maps at ``site`` under ``method``."""
        layer = next(
            lo for lo in self.layers + [self.final_norm] if lo is not None and lo.site == site
        )
        return trace.patch_maps(site) > layer.thresholds[method]

    def to_dict(self) -> dict:
        return {
            "verdict": "artifacts" if self.verdict else "no artifacts",
            "artifacts_present": self.verdict,
            "emergence_layer": self.emergence_layer,
            "evidence": self.evidence,
            "rules": self.rules,
            "layers": [lo.to_dict() for lo in self.layers],
            "after_final_norm": self.final_norm.to_dict() if self.final_norm else None,
        }


def outliers(trace: NormTrace, rules: dict[str, dict[str, float]] | None = None) -> OutlierReport:
    """Apply every rule at every block output; decide presence from the bimodal fit alone.

    The verdict is positive when some layer's patch norms split into a minority mode at least
    ``MIN_MODE_RATIO`` times the bulk, cleanly separated; ``top_p`` is reported beside it but
    never decides, since it flags p% of tokens in every model. The emergence layer is the first
    layer from which the split holds at that layer and the next (or the last layer).
    """
    rules = dict(DEFAULT_RULES if rules is None else rules)
    for method in rules:
        if method not in METHODS:
            raise ValueError(f"unknown outlier method {method!r}; choose from {METHODS}")
    rules.setdefault("auto", {})
    layers = [layer_outliers(trace, s, rules, i) for i, s in enumerate(trace.sites)]
    final = layer_outliers(trace, trace.final_site, rules, None) if trace.final_site else None
    present = [lo.present for lo in layers]
    emergence = next(
        (i for i, p in enumerate(present) if p and (i + 1 == len(present) or present[i + 1])), None
    )
    verdict = emergence is not None
    strongest = max(layers, key=lambda lo: lo.bimodal.ashman_d if lo.present else -1.0)
    evidence: dict[str, Any] = {
        "layers_with_outlier_mode": [i for i, p in enumerate(present) if p],
        "strongest_layer": strongest.layer if verdict else None,
        "mode_ratio": strongest.bimodal.mode_ratio if verdict else None,
        "ashman_d": strongest.bimodal.ashman_d if verdict else None,
        "outlier_rate": strongest.rates["auto"] if verdict else 0.0,
        "after_final_norm_present": final.present if final else None,
        "criteria": "two-Gaussian fit of log10 patch norms: BIC gain > 10, Ashman D > 2, "
        "upper weight <= 0.3, upper/lower median ratio >= 3",
    }
    return OutlierReport(layers, final, rules, emergence, verdict, evidence)


@dataclass
class NormsResult:
    """The per-token norm trace (for maps and figures) and the outlier report."""

    trace: NormTrace
    report: OutlierReport

    def to_dict(self) -> dict:
        return {"n_images": self.trace.n_images, **self.report.to_dict()}


class NormAnalysis(Analysis):
    """Token norms at every block output and after the final norm; outliers by every rule."""

    name = "norms"

    def __init__(self, rules: dict[str, dict[str, float]] | None = None) -> None:
        self.rules = rules

    def reducers(self, model: Model) -> list[Reducer]:
        sites, final = norm_sites(model)
        return [TokenNorms(s) for s in sites + ([final] if final else [])]

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Any]) -> NormsResult:
        sites, final = norm_sites(model)
        norms = {r.site: r.result()["norms"] for r in trace.reducers}
        layouts = {s: trace.layouts[s] for s in norms}
        nt = NormTrace(sites, norms, layouts, final, trace.n_images)
        return NormsResult(nt, outliers(nt, self.rules))
