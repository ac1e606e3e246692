"""Token norms per layer and token type, outliers by every rule, emergence layer and verdict.

Norms are taken on the residual stream (each block's output, before any final LayerNorm) and,
separately, after the final norm, where outliers can vanish (facebookresearch/dinov2#373). Outlier rules
run on patch tokens; [CLS], registers and inserted tokens are summarised on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vitreg.analysis.base import Analysis, Finished, Traced, run_analyses
from vitreg.analysis.rules import SET_RULES as METHODS
from vitreg.analysis.rules import threshold
from vitreg.analysis.thresholds import bimodal_fit
from vitreg.core.layout import TokenLayout
from vitreg.core.renamed import renamed
from vitreg.hooks.reducers import Reducer, TokenNorms
from vitreg.models.model import Model, TraceResult
from vitreg.progress import Update
from vitreg.results.diagnose import Evidence, Norms, Quantiles, SiteNorms

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


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def layer_outliers(
    trace: NormTrace, site: str, rules: dict[str, dict[str, float]], layer: int | None
) -> SiteNorms:
    """Outlier statistics of the patch tokens at ``site`` by every rule."""
    patch = trace.patch_norms(site).numpy().ravel()
    qs = np.quantile(patch, QUANTILES) if patch.size else np.zeros(len(QUANTILES))
    quantiles = Quantiles(**dict(zip(Quantiles.model_fields, map(float, qs), strict=True)))
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
    thresholds = {
        method: fit.cut if method == "auto" else threshold(patch, method, **params)
        for method, params in rules.items()
    }
    rates = {m: float((patch > t).mean()) if patch.size else 0.0 for m, t in thresholds.items()}
    median = max(quantiles.p50, 1e-12)
    return SiteNorms(
        site=site,
        layer=layer,
        quantiles=quantiles,
        mean_norm_by_type=by_type,
        bimodal=fit,
        thresholds={k: _finite(v) for k, v in thresholds.items()},
        outlier_rate=rates,
        artifacts_present=fit.present,
        p98_over_median=quantiles.p98 / median,
        max_over_median=quantiles.max / median,
    )


def outliers(trace: NormTrace, rules: dict[str, dict[str, float]] | None = None) -> Norms:
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
    present = [lo.artifacts_present for lo in layers]
    emergence = next(
        (i for i, p in enumerate(present) if p and (i + 1 == len(present) or present[i + 1])), None
    )
    verdict = emergence is not None
    strongest = max(
        layers, key=lambda lo: (lo.bimodal.ashman_d or 0.0) if lo.artifacts_present else -1.0
    )
    evidence = Evidence(
        layers_with_outlier_mode=[i for i, p in enumerate(present) if p],
        strongest_layer=strongest.layer if verdict else None,
        mode_ratio=strongest.bimodal.mode_ratio if verdict else None,
        ashman_d=strongest.bimodal.ashman_d if verdict else None,
        outlier_rate=strongest.outlier_rate["auto"] if verdict else 0.0,
        after_final_norm_present=final.artifacts_present if final else None,
        criteria="two-Gaussian fit of log10 patch norms: BIC gain > 10, Ashman D > 2, "
        "upper weight <= 0.3, upper/lower median ratio >= 3",
    )
    return Norms(
        n_images=trace.n_images,
        verdict="artifacts" if verdict else "no artifacts",
        artifacts_present=verdict,
        emergence_layer=emergence,
        evidence=evidence,
        rules=rules,
        layers=layers,
        after_final_norm=final,
    )


@dataclass
class NormsResult(Traced):
    """The per-token norm trace (for maps and figures) and its outlier summary."""

    trace: NormTrace
    summary: Norms

    def site(self, site: str) -> SiteNorms:
        """The outlier statistics at ``site`` (a block output or the final norm)."""
        found = [*self.summary.layers, self.summary.after_final_norm]
        return next(lo for lo in found if lo is not None and lo.site == site)

    def masks(self, site: str, method: str = "auto") -> torch.Tensor:
        """``[n_images, h, w]`` bool outlier maps at ``site`` under ``method``."""
        return self.trace.patch_maps(site) > self.site(site).cut(method)


class NormAnalysis(Analysis):
    """Token norms at every block output and after the final norm; outliers by every rule."""

    name = "norms"

    def __init__(self, rules: dict[str, dict[str, float]] | None = None) -> None:
        self.rules = rules

    def reducers(self, model: Model) -> list[Reducer]:
        sites, final = norm_sites(model)
        return [TokenNorms(s) for s in sites + ([final] if final else [])]

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> NormsResult:
        nt = self.norm_trace(model, trace)
        return NormsResult(nt, outliers(nt, self.rules))

    def norm_trace(self, model: Model, trace: TraceResult) -> NormTrace:
        """The per-token norms of a finished pass (before any outlier statistic)."""
        sites, final = norm_sites(model)
        norms = {r.site: r.result()["norms"] for r in trace.reducers}
        layouts = {s: trace.layouts[s] for s in norms}
        return NormTrace(sites, norms, layouts, final, trace.n_images)


__getattr__ = renamed(__name__, {"LayerOutliers": "SiteNorms", "OutlierReport": "Norms"}, globals())
