"""Where register neurons are searched and outliers detected, chosen from data with reasons.

One streaming pass over a few images gives every block's patch-norm distribution and the
presence test of ``vitreg diagnose``. From it:

- **emergence layer** E: the first block whose output shows an outlier mode and the next too (as
  ``vitreg diagnose`` says), else the first block with one (a mode that one block holds and the
  next resolves is still one: the fix is judged by the presence test at every block);
- **images**: the discovery images; when they show no outlier mode at any block, the held-out
  images are surveyed with them before the model is called clean (a weak mode in a minority of
  the images can escape a few of them);
- **detection layer**: among blocks E..last with an outlier mode, the cleanest split (largest
  Ashman D); the last block is passed over when another qualifies, since its norms change just
  before the final norm (the paper uses the second-to-last block of DINOv2 for this reason);
- **threshold**: the valley between the bulk and the outlier mode at the detection layer;
- **layer range** 0..H, by where the outliers are *written*: the growth curve measures, block by
  block, the excess of the detection layer's outlier patches over the ordinary ones (mean
  ``log(norm / median)`` above 0, outlier patches minus the rest) and its growth over the block
  before; H is the last block up to the detection layer where it grows by at least
  :data:`GROWTH_SHARE` of its size at the detection layer (never below E). Writers can sit after
  E (they keep amplifying the outlier); readers sit there too, and the causal check tells them
  apart. The paper sets this ``top_layer`` by hand.
"""

from __future__ import annotations

from typing import Any

from vitreg.analysis.norms import NormsResult, NormTrace, norm_report
from vitreg.analysis.rules import MASK_RULES, image_mask
from vitreg.core.renamed import renamed
from vitreg.errors import InputError, VitregError
from vitreg.models.model import Model, iter_batches
from vitreg.results.diagnose import Norms
from vitreg.results.neurons import DetectionRecord, GrowthRow, SurveyRow
from vitreg.settings.neurons import NeuronSearch

RULES = MASK_RULES  # the rules of vitreg.analysis.rules that give a mask batch by batch
GROWTH_SHARE = 0.05  # a block writes the outliers when their excess grows by this share there


def layer_index(i: int, n: int, what: str = "layer") -> int:
    """``i`` (negative counts from the end) as an index into ``n`` blocks, or a clear error."""
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise InputError(f"{what} {i} is outside a {n}-block model (blocks 0..{n - 1})")
    return j


def _largest_ratio(report: Norms) -> str:
    """The largest max/median patch norm over the blocks, as a phrase."""
    if not report.layers:
        return "no block traced"
    top = max(report.layers, key=lambda site: site.max_over_median)
    return f"the largest patch norm is {top.max_over_median:.2f}x the median, at block {top.layer}"


def choose_detection(
    model: Model,
    data: Any,
    search: NeuronSearch | None = None,
    *,
    lowest_layer: int = 0,
    n_images: int = 32,
    batch_size: int = 32,
    more: Any = None,
) -> DetectionRecord:
    """Survey ``n_images`` of ``data`` and choose what ``search`` leaves open (its detection
    layer, highest layer and threshold are kept when given; default: all chosen). ``more``:
    images surveyed with them when they show no outlier mode at any block (the held-out ones).

    Raises when the images show no outlier mode and the choice depends on one.
    """
    return surveyed_detection(
        model,
        data,
        search,
        lowest_layer=lowest_layer,
        n_images=n_images,
        batch_size=batch_size,
        more=more,
    )[0]


def surveyed_detection(
    model: Model,
    data: Any,
    search: NeuronSearch | None = None,
    *,
    lowest_layer: int = 0,
    n_images: int = 32,
    batch_size: int = 32,
    more: Any = None,
) -> tuple[DetectionRecord, NormTrace]:
    """:func:`choose_detection`, with the survey's norm trace it chose from (the surveyed
    images of ``data`` first, then ``more``'s when they were added)."""
    search = search if search is not None else NeuronSearch()
    n = model.n_layers
    rule = "absolute" if isinstance(search.threshold, (int, float)) else search.threshold
    if rule not in RULES:
        raise InputError(f"threshold must be one of {RULES} or a number, got {search.threshold!r}")
    found, widened = _survey(model, data, more, n_images, batch_size)
    trace, report = found.trace, found.summary
    emergence = first_mode(report)
    if emergence is None and (
        search.detect_layer is None or search.highest_layer is None or rule == "auto"
    ):
        raise VitregError(
            f"no high-norm outliers found on these {report.n_images} images (no block shows a "
            f"separate outlier mode; {_largest_ratio(report)}), so there are no register neurons "
            "to find: the model looks clean. If it should not, check the images (natural photos, "
            "the model's own preprocessing) or run `vitreg diagnose` to see the norm distribution"
        )
    reasons: dict[str, str] = {}
    detect, value, growth = _detection_layer(trace, report, search, rule, n, reasons)
    if widened:
        reasons["detect_layer"] += (
            f"; surveyed on {trace.n_images} images, the held-out ones included, since the "
            "discovery images alone show no outlier mode at any block"
        )
    written = _written(growth, detect)
    if search.highest_layer is not None:
        highest = layer_index(search.highest_layer, n, "--highest-layer")
        reasons["highest_layer"] = f"blocks {lowest_layer}-{highest}: given"
    else:
        highest, reasons["highest_layer"] = _range(growth, written, emergence, detect, lowest_layer)
    if not 0 <= lowest_layer <= highest:
        raise InputError(f"the lowest searched block {lowest_layer} is above the highest {highest}")
    record = DetectionRecord(
        detect_layer=detect,
        highest_layer=highest,
        lowest_layer=lowest_layer,
        threshold=rule,
        threshold_value=value,
        emergence_layer=emergence,
        n_images=trace.n_images,
        layers=_survey_rows(report),
        reasons=reasons,
        growth=growth,
        first_written=min([emergence if emergence is not None else detect, *written]),
    )
    return record, trace


def _survey(
    model: Model, data: Any, more: Any, n_images: int, batch_size: int
) -> tuple[NormsResult, bool]:
    """The norm trace of ``n_images`` of ``data``, or of them and ``more`` when they show no
    outlier mode at any block; whether ``more`` was added."""
    found = norm_report(model, data, batch_size=batch_size, limit=n_images)
    if more is None or any(lo.artifacts_present for lo in found.summary.layers):
        return found, False
    batches = [*iter_batches(data, batch_size, n_images), *iter_batches(more, batch_size)]
    return norm_report(model, batches, batch_size=batch_size), True


def first_mode(report: Norms) -> int | None:
    """The emergence layer: the first block with an outlier mode that the next block keeps
    (``report``'s), else the first block with one."""
    if report.emergence_layer is not None:
        return report.emergence_layer
    return next((lo.layer for lo in report.layers if lo.artifacts_present), None)


def _survey_rows(report: Any) -> list[SurveyRow]:
    """One row per block of the survey: its outlier mode and how clean the split is."""
    return [
        SurveyRow(
            layer=lo.layer,
            outlier_mode=lo.artifacts_present,
            ashman_d=lo.bimodal.ashman_d,
            mode_ratio=lo.bimodal.mode_ratio,
            max_over_median=lo.quantiles.max / max(lo.quantiles.p50, 1e-12),
        )
        for lo in report.layers
    ]


def _detection_layer(
    trace: NormTrace,
    report: Any,
    search: NeuronSearch,
    rule: str,
    n: int,
    reasons: dict[str, str],
) -> tuple[int, float | None, list[GrowthRow]]:
    """The detection layer of an ``n``-block model (given, else the cleanest split where the
    writing is done), its threshold value and the growth curve there; why, into ``reasons``."""
    emergence = first_mode(report)
    if search.detect_layer is not None:
        detect = layer_index(search.detect_layer, n, "--detect-layer")
        reasons["detect_layer"] = f"block {detect}: given"
    else:
        detect, reasons["detect_layer"] = _detect(report.layers, emergence, n)
    value, reasons["threshold"] = _threshold(report, detect, rule, search.threshold)
    growth = growth_curve(trace, detect, rule, value)
    late = [r.layer for r in growth[detect + 1 :] if _grows(r, growth[detect])]
    if (
        search.detect_layer is None
        and late
        and any(lo.artifacts_present for lo in report.layers[max(late) :])
    ):
        # the outliers are still written after the chosen block: detect where they are whole
        detect, why = _detect(report.layers, max(late), n)
        reasons["detect_layer"] = (
            f"{why}; the outliers still grow at blocks {late}, after the cleanest split "
            "before them, so they are detected where their writing is done"
        )
        value, reasons["threshold"] = _threshold(report, detect, rule, search.threshold)
        growth = growth_curve(trace, detect, rule, value)
    return detect, value, growth


def growth_curve(trace: NormTrace, detect: int, rule: str, value: float | None) -> list[GrowthRow]:
    """Per block: the excess of the detection layer's outlier patches over the ordinary ones
    (mean ``log(norm / median)`` above 0, outliers minus the rest) and its growth there."""
    site = trace.sites[detect]
    lay = trace.layouts[site]
    mask = image_mask(trace.norms[site], rule, value)[:, lay.patches]
    rows, before = [], 0.0
    for i, s in enumerate(trace.sites):
        patches = trace.patch_norms(s)
        logs = (patches / max(float(patches.median()), 1e-12)).log().clamp_min(0)
        out = float(logs[mask].mean()) if mask.any() else 0.0
        rest = float(logs[~mask].mean()) if (~mask).any() else 0.0
        rows.append(GrowthRow(layer=i, excess=out - rest, growth=out - rest - before))
        before = out - rest
    return rows


def _threshold(
    report: Any, detect: int, rule: str, threshold: str | float
) -> tuple[float | None, str]:
    """The detection threshold at block ``detect`` (``None`` for per-image rules), and why."""
    if rule == "auto":
        value = report.layers[detect].cut("auto")
        if value == float("inf"):
            raise VitregError(
                f"block {detect} shows no outlier mode on these images, so the 'auto' threshold "
                "(the valley between the bulk and the outlier mode) does not exist there; pick "
                f"another --detect-layer (blocks with a mode: {_with_mode(report.layers)}) or "
                "give --threshold as a norm"
            )
        return value, (
            f"{value:.4g}: the valley between the bulk of the patch norms and the outlier mode "
            f"at block {detect}"
        )
    if rule == "absolute":
        return float(threshold), f"{float(threshold):.4g}: given"
    return None, f"{rule}: given (per image)"


def _grows(row: GrowthRow, at_detect: GrowthRow) -> bool:
    """Whether the outliers' excess grows at ``row``'s block by GROWTH_SHARE of its size."""
    return row.growth >= GROWTH_SHARE * at_detect.excess


def _written(growth: list[GrowthRow], detect: int) -> list[int]:
    """The blocks up to ``detect`` where the outliers' excess grows by ``GROWTH_SHARE``."""
    return [r.layer for r in growth[: detect + 1] if _grows(r, growth[detect])]


def _range(
    growth: list[GrowthRow], grew: list[int], emergence: int, detect: int, lowest: int
) -> tuple[int, str]:
    """The last block up to ``detect`` where the outliers' excess grows, and why."""
    size = growth[detect].excess
    highest = max([emergence, *grew])
    shares = ", ".join(f"{r.layer} (+{r.growth / size:.0%})" for r in growth if r.layer in grew)
    why = (
        f"blocks {lowest}-{highest}: the outliers first appear at the output of block "
        f"{emergence}, and the excess of the block-{detect} outlier patches over ordinary ones "
        f"grows by at least {GROWTH_SHARE:.0%} of its block-{detect} size at blocks {shares or '-'}"
        f"; units writing them sit there, and units after block {highest} only carry them. "
        "Units in the range that only read an outlier are told apart by the causal check"
    )
    return highest, why


def _with_mode(layers: list[Any]) -> list[int]:
    return [lo.layer for lo in layers if lo.artifacts_present]


def _detect(layers: list[Any], emergence: int, n: int) -> tuple[int, str]:
    """The cleanest outlier split from the emergence layer on, the last block only if alone."""
    candidates = [lo for lo in layers[emergence:] if lo.artifacts_present]
    passed_over = len(candidates) > 1 and candidates[-1].layer == n - 1
    if passed_over:
        candidates = candidates[:-1]
    best = max(candidates, key=lambda lo: lo.bimodal.ashman_d)  # ties: the earliest
    why = (
        f"block {best.layer}: the cleanest outlier mode (Ashman D {best.bimodal.ashman_d:.3g}, "
        f"outlier mode {best.bimodal.mode_ratio:.3g}x the bulk) among blocks "
        f"{emergence}-{n - 1} with one"
    )
    if passed_over:
        why += (
            "; the last block is passed over because its norms change just before the final "
            "norm (as the paper does for DINOv2)"
        )
    return best.layer, why


__getattr__ = renamed(__name__, {"Detection": "DetectionRecord"}, globals())
