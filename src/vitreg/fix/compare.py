"""Before/after a test-time-register fix: outliers, per-layer max norms, register norms, and
whether the global embedding is kept (cosine of the pooled token before vs after)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from vitreg.analysis.attention import AttentionAnalysis, AttentionResult
from vitreg.analysis.base import Analysis, Finished, run_analyses
from vitreg.analysis.feature_pictures import FeaturePictureAnalysis, FeaturePicturesResult
from vitreg.analysis.norms import NormAnalysis, NormsResult
from vitreg.analysis.rules import FIX_TOLERANCE as TOLERANCE
from vitreg.analysis.rules import fix_is_clean, ordinary_level
from vitreg.analysis.rules import image_mask as outlier_mask
from vitreg.fix.controls import ablate, random_like, shift_to_patch
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.hooks.reducers import Reducer
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, TraceResult
from vitreg.progress import SILENT, Progress
from vitreg.results.fix import Comparison, Control, Cosine, Residual


class PooledRows(TypedDict):
    """The global embedding ``[n_images, C]`` of every image, in image order."""

    pooled: torch.Tensor


class PatchRows(TypedDict):
    """The patch features ``[n_images, n_patches, C]`` of the images kept, in image order."""

    patches: torch.Tensor


class Pooled(Reducer[PooledRows]):
    """Per-image global embedding at the final norm: [CLS], or the patch mean without one."""

    def __init__(self, site: str) -> None:
        super().__init__(site)
        self.rows: dict[int, torch.Tensor] = {}

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        lay = ctx.layout
        x = t.float()
        pooled = lay.cls_token(x) if lay.n_cls else lay.take(x, "patches").mean(1)
        for i, row in enumerate(pooled.cpu()):
            self.rows[image_offset + i] = row

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, Pooled)
        self.rows.update(other.rows)

    def result(self) -> PooledRows:
        return {"pooled": torch.stack([self.rows[i] for i in sorted(self.rows)])}


DENSE_IMAGES = 64  # images whose every patch feature is compared before vs after (memory bound)


class PatchFeatures(Reducer[PatchRows]):
    """The patch tokens at the final norm of the first ``keep`` images (the dense output)."""

    def __init__(self, site: str, keep: int = DENSE_IMAGES) -> None:
        super().__init__(site)
        self.keep = keep
        self.rows: dict[int, torch.Tensor] = {}

    def update(self, t: torch.Tensor, ctx: HookContext, image_offset: int) -> None:
        patches = ctx.layout.take(t.float(), "patches")
        for i, row in enumerate(patches.cpu()):
            if image_offset + i < self.keep:
                self.rows[image_offset + i] = row

    def merge(self, other: Reducer) -> None:
        assert isinstance(other, PatchFeatures)
        self.rows.update(other.rows)

    def result(self) -> PatchRows:
        return {"patches": torch.stack([self.rows[i] for i in sorted(self.rows)])}


class PooledAnalysis(Analysis):
    name = "pooled"

    def not_applicable(self, model: Model) -> str | None:
        return None if "ln_final.hook_out" in model.hook_names() else "no ln_final.hook_out site"

    def reducers(self, model: Model) -> list[Reducer]:
        return [Pooled("ln_final.hook_out")]

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> torch.Tensor:
        return trace.reducers[0].result()["pooled"]


class DenseAnalysis(PooledAnalysis):
    """The patch features at the final norm of the first :data:`DENSE_IMAGES` images."""

    name = "dense"

    def reducers(self, model: Model) -> list[Reducer]:
        return [PatchFeatures("ln_final.hook_out")]

    def finish(self, model: Model, trace: TraceResult, done: dict[str, Finished]) -> torch.Tensor:
        return trace.reducers[0].result()["patches"]


@dataclass
class FixComparison:
    """A fix compared before and after on the same images: ``results``, the typed summary that
    metrics.json holds, and the traces its figures read (norms, attention maps, feature
    pictures, each without and with the fix)."""

    results: Comparison
    before: NormsResult
    after: NormsResult
    attention_before: AttentionResult | None = None
    attention_after: AttentionResult | None = None
    pictures_before: FeaturePicturesResult | None = None
    pictures_after: FeaturePicturesResult | None = None


def residual(
    before: NormsResult,
    after: NormsResult,
    detection: tuple[int, str, float | None],
    ordinary: float | None,
    tolerance: float = TOLERANCE,
) -> Residual:
    """What the fix leaves, judged by a criterion it was not tuned on: the presence test at
    every block and the max/median patch norm against the ordinary patches' level."""
    layers_b, layers_a = before.summary.layers, after.summary.layers
    d, rule, value = detection
    modes_after = [i for i, lo in enumerate(layers_a) if lo.artifacts_present]
    modes_before = [i for i, lo in enumerate(layers_b) if lo.artifacts_present]
    clean = fix_is_clean(modes_after, _ratio(layers_a[d]), ordinary, tolerance)
    nothing = not modes_before and not before.summary.artifacts_present
    verdict = (
        "no artifacts before the fix: nothing to remove"
        if nothing
        else "no artifacts after the fix"
        if clean
        else "artifacts remain after the fix"
    )
    largest = layers_b[d].quantiles.max
    return Residual(
        clean=clean,
        nothing_to_fix=nothing,
        verdict=verdict,
        threshold_from_another_model=value is not None
        and rule in ("auto", "absolute")
        and value > largest,
        largest_patch_norm_before=largest,
        blocks_with_mode_before=modes_before,
        blocks_with_mode_after=modes_after,
        max_over_median_before=[_ratio(lo) for lo in layers_b],
        max_over_median_after=[_ratio(lo) for lo in layers_a],
        ordinary_max_over_median=ordinary,
        tolerance=tolerance,
    )


def _ratio(layer: Any) -> float:
    return layer.quantiles.max / max(layer.quantiles.p50, 1e-12)


def cosine_stats(cos: torch.Tensor | None) -> Cosine | None:
    """Mean, minimum and count of per-image cosines (None when there are none)."""
    if cos is None:
        return None
    return Cosine(mean=float(cos.mean()), min=float(cos.min()), n=int(cos.numel()))


def _attn_max(attn: AttentionResult | None) -> list[float] | None:
    """Per layer, the largest head-mean attention a patch receives ([CLS] row or mean query)."""
    return None if attn is None else list(attn.summary.cls_to_patch_max)


def _flagged(result: NormsResult, layer: int, rule: str, value: float | None) -> torch.Tensor:
    """``[n_images, n_patches]`` patches flagged as outliers at ``layer``."""
    site = result.trace.sites[layer]
    lay = result.trace.layouts[site]
    return outlier_mask(result.trace.norms[site], rule, value)[:, lay.patches]


def _rate(result: NormsResult, layer: int, rule: str, value: float | None) -> float:
    return float(_flagged(result, layer, rule, value).float().mean())


def _ordinary(result: NormsResult, layer: int, rule: str, value: float | None) -> float:
    """Max/median patch norm of the patches that are not outliers (the level a fix should reach)."""
    patches = result.trace.patch_norms(result.trace.sites[layer])
    return ordinary_level(patches, _flagged(result, layer, rule, value))


def image_count(data: Any, limit: int | None) -> int | None:
    """The images one pass over ``data`` reads (``None`` for a stream of unknown length)."""
    n = getattr(data, "total", None)
    if n is None and hasattr(data, "__len__"):
        n = len(data)
    return n if limit is None or n is None else min(n, limit)


def compare_fix(
    model: Model,
    ttr: TestTimeRegisters,
    data: Any,
    batch_size: int = 32,
    limit: int | None = None,
    progress: Progress = SILENT,
    controls: bool = True,
    max_maps: int = 4,
) -> FixComparison:
    """Run ``data`` without and with ``ttr`` and compare at the neurons' detection layer.

    Attention maps are kept for the first ``max_maps`` images. With ``controls``, two more passes
    measure the paper's causal controls: the register neurons zeroed with no register, as many
    random neurons of the same layers zeroed, and the outlier moved to the first patch.
    ``progress`` shows one phase per pass over the images, each counting them once.
    """
    settings = ttr.neurons.settings
    total = image_count(data, limit)
    with progress(total, "images without the fix") as update:
        before, _, _ = run_analyses(
            model, data, _analyses(settings, max_maps), batch_size, limit, update
        )
    with ttr.applied(model), progress(total, "images with the fix") as update:
        after, _, _ = run_analyses(
            model, data, _analyses(settings, max_maps), batch_size, limit, update
        )
    nb, na = before["norms"], after["norms"]
    detect, rule, value = _detection(nb, settings)
    checks: dict[str, Control] = {}
    if controls:
        checks = _controls(model, ttr, data, before, (detect, rule, value), batch_size, limit)
    ordinary = _ordinary(nb, detect, rule, value)
    results = Comparison(
        fix=ttr.settings(),
        detect_layer=detect,
        rule=rule,
        threshold_value=value,
        outlier_rate_before=_rate(nb, detect, rule, value),
        outlier_rate_after=_rate(na, detect, rule, value),
        max_patch_norm_before=[lo.quantiles.max for lo in nb.summary.layers],
        max_patch_norm_after=[lo.quantiles.max for lo in na.summary.layers],
        median_patch_norm_before=[lo.quantiles.p50 for lo in nb.summary.layers],
        median_patch_norm_after=[lo.quantiles.p50 for lo in na.summary.layers],
        register_norm_after=_register_norms(na),
        verdict_before=nb.summary.artifacts_present,
        verdict_after=na.summary.artifacts_present,
        pooled_cosine=cosine_stats(_cosine(before, after)),
        patch_cosine=cosine_stats(_dense_cosine(before, after)),
        cls_attention_max_before=_attn_max(before.get("attention")),
        cls_attention_max_after=_attn_max(after.get("attention")),
        controls=checks,
        residual=residual(nb, na, (detect, rule, value), ordinary),
    )
    return FixComparison(
        results,
        nb,
        na,
        before.get("attention"),
        after.get("attention"),
        before.get("feature_pictures"),
        after.get("feature_pictures"),
    )


def _analyses(settings: dict[str, Any], max_maps: int) -> list[Analysis]:
    """The analyses of one pass before or after the fix (fresh ones for each pass)."""
    pictures = FeaturePictureAnalysis(keep=max_maps, layer=settings.get("detect_layer"))
    return [
        NormAnalysis(),
        AttentionAnalysis(max_maps=max_maps),
        PooledAnalysis(),
        DenseAnalysis(),
        pictures,
    ]


def _detection(nb: NormsResult, settings: dict[str, Any]) -> tuple[int, str, float | None]:
    """The detection layer, outlier rule and threshold of the neurons (or of the run before)."""
    detect = settings.get("detect_layer", nb.summary.evidence.strongest_layer)
    if detect is None:
        detect = len(nb.trace.sites) - 1
    rule = settings.get("threshold", "auto")
    value = settings.get("threshold_value")
    if rule == "auto" and value is None:
        value = nb.summary.layers[detect].cut("auto")
    return detect, rule, value


def _register_norms(na: NormsResult) -> list[float]:
    """Per block, the mean norm of the test-time registers after the fix (0 without any)."""
    registers = []
    for site in na.trace.sites:
        lay = na.trace.layouts[site]
        registers.append(
            float(lay.take(na.trace.norms[site], "extra").mean()) if lay.n_extra else 0.0
        )
    return registers


def _controls(
    model: Model,
    ttr: TestTimeRegisters,
    data: Any,
    before: dict[str, Any],
    detection: tuple[int, str, float | None],
    batch_size: int,
    limit: int | None,
) -> dict[str, Control]:
    """The causal controls: the register neurons or as many random ones zeroed with no
    register, and the outlier moved to the first patch; each pass's outliers and cosine."""
    detect, rule, value = detection
    checks = {}
    others = random_like(ttr.neurons, model.d_mlp, seed=ttr.seed)
    for name, neurons in (
        ("ablate_register_neurons", ttr.neurons),
        ("ablate_random_neurons", others),
    ):
        with ablate(model, neurons):
            ran, _, _ = run_analyses(
                model, data, [NormAnalysis(), PooledAnalysis()], batch_size, limit
            )
        checks[name] = Control(
            n_neurons=len(neurons),
            outlier_rate=_rate(ran["norms"], detect, rule, value),
            pooled_cosine=cosine_stats(_cosine(before, ran)),
        )
    with shift_to_patch(model, ttr.neurons, 0):
        ran, _, _ = run_analyses(model, data, [NormAnalysis(), PooledAnalysis()], batch_size, limit)
    site = ran["norms"].trace.sites[detect]
    top = ran["norms"].trace.patch_norms(site).argmax(dim=1)
    checks["shift_to_patch"] = Control(
        n_neurons=len(ttr.neurons),
        patch=0,
        share_of_images_with_top_norm_at_patch=float((top == 0).float().mean()),
        outlier_rate=_rate(ran["norms"], detect, rule, value),
        pooled_cosine=cosine_stats(_cosine(before, ran)),
    )
    return checks


def _dense_cosine(a: dict[str, Any], b: dict[str, Any]) -> torch.Tensor | None:
    """Per-patch cosine between the final patch features of two runs (None without them)."""
    if "dense" not in a or "dense" not in b:
        return None
    return torch.nn.functional.cosine_similarity(a["dense"], b["dense"], dim=-1).flatten()


def _cosine(a: dict[str, Any], b: dict[str, Any]) -> torch.Tensor | None:
    """Per-image cosine between the pooled embeddings of two runs (None without them)."""
    if "pooled" not in a or "pooled" not in b:
        return None
    return torch.nn.functional.cosine_similarity(a["pooled"], b["pooled"], dim=-1)
