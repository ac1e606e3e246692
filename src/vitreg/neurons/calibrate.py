"""Choose top-k for test-time registers by what the fix leaves on held-out images.

A k passes when, with the first k neurons fixed, (1) no block shows an outlier mode any more (the
presence test of ``vitreg diagnose``, at every block), (2) the max/median patch norm at the
detection layer is back within ``tolerance`` x the level of the ordinary patches before the fix,
(3) the patch outlier rate under the discovery threshold is at most ``target``, and (4) at every
block that showed an outlier mode before the fix, (2) holds too, against that block's own
ordinary level before the fix (a weakened mode that the presence test no longer sees still
counts). (3) alone is what the fix was tuned on and can read 0% while the outliers only shrank
below the threshold, so it never decides by itself; and where the threshold sits inside the
tolerance band of the ordinary patches (below ``tolerance`` x their level x the median), the
model with every cause zeroed has patches above it too, so there (3) is reported but does not
decide, as the patches above each block's own threshold at the blocks of (4). Checked at one or
several input resolutions (a set chosen at one resolution is known to fail at another). When no
k passes, the result is "partial".

:func:`confirm_on` then repeats the presence test with the chosen fix on every image given
(the discovery images as well as the held-out ones): a weak mode in a minority of the images
can be absent from the few held out, and "clean" is said only when no block shows one there
and the max/median at the detection layer over them all is within the tolerance of their
ordinary level before the fix (outlier patches on a few images make no mode).
The held-out images' norms under that fix are the calibration's own (:meth:`TopKCurve.traced`),
pooled with the discovery images' after them, so only the discovery images are traced again.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from vitreg.analysis.base import run_analyses
from vitreg.analysis.norms import NormAnalysis, NormTrace, norm_report
from vitreg.analysis.rules import FIX_TOLERANCE as TOLERANCE
from vitreg.analysis.rules import fix_is_clean, image_mask, ordinary_level
from vitreg.core.renamed import loose_settings
from vitreg.errors import VitregError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.models.model import Model, TraceResult, iter_batches
from vitreg.progress import Update
from vitreg.results.diagnose import Norms
from vitreg.results.neurons import BlockCheck, Calibration
from vitreg.settings.neurons import NeuronSearch
from vitreg.settings.ttr import TtrSettings

DEFAULT_KS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)


@dataclass
class FixCheck:
    """What a fix leaves at one resolution: per-block outlier modes and the detection layer."""

    k: int
    outlier_rate: float
    max_norm: float
    median_norm: float
    max_over_median: float
    ordinary_max_over_median: float  # non-outlier patches before any fix
    blocks_with_mode: list[int]
    clean: bool  # no outlier mode anywhere and max/median at the ordinary level at every block
    blocks: list[BlockCheck] = field(default_factory=list)  # blocks with a mode before
    trace: NormTrace | None = field(default=None, repr=False, compare=False)  # the fix's norms
    rate_decides: bool = True  # the threshold lies above the ordinary patches' tolerance band
    ordinary_all: float | None = None  # the ordinary level over every image given, unfixed


def _fix(neurons: NeuronSet, ttr: TtrSettings | None) -> TestTimeRegisters:
    """The test-time registers of ``neurons`` as ``ttr`` says (default: the paper's)."""
    return (
        TestTimeRegisters(neurons) if ttr is None else TestTimeRegisters.from_settings(neurons, ttr)
    )


def _resize(batch: torch.Tensor, size: int | None) -> torch.Tensor:
    if size is None or batch.shape[-1] == size and batch.shape[-2] == size:
        return batch
    return F.interpolate(batch, size=(size, size), mode="bicubic", align_corners=False)


def check_fix(
    model: Model,
    neurons: NeuronSet,
    data: Any,
    detect_layer: int,
    rule: str,
    value: float | None,
    *,
    ordinary: float | None = None,
    before: FixCheck | None = None,
    tolerance: float = TOLERANCE,
    size: int | None = None,
    batch_size: int = 32,
    limit: int | None = None,
    ttr: TtrSettings | None = None,
    target: float | None = None,
) -> FixCheck:
    """Trace every block with the first-k fix applied (k = ``len(neurons)``; 0 = no fix), the
    test-time registers as ``ttr`` says (default: the paper's).

    ``ordinary``: the ordinary patches' max/median before the fix; measured here when ``None``
    (which is right only for the unfixed model, k = 0). ``before``: the check without the fix,
    whose blocks with an outlier mode (their threshold and ordinary level) are checked here too;
    ``None`` for the check without the fix itself, which measures them. ``target`` is
    deprecated and ignored: such a block is judged by its max/median against its own ordinary
    level, and its patches above the threshold are counted, not bounded.
    """
    if target is not None:
        warnings.warn(
            "check_fix(target=...) is deprecated and ignored: a block with an outlier mode is "
            "judged by its max/median against its ordinary level",
            DeprecationWarning,
            stacklevel=2,
        )
    batches = [_resize(b, size) for b in iter_batches(data, batch_size, limit)]
    if not batches:
        raise VitregError("calibration got no images")
    fix = _fix(neurons, ttr)
    with fix.applied(model):
        found = norm_report(model, batches, batch_size=batch_size)
    trace, report = found.trace, found.summary
    site = trace.sites[detect_layer]
    lay = trace.layouts[site]
    patches = trace.patch_norms(site)
    flagged = image_mask(trace.norms[site], rule, value)[:, lay.patches]
    median = float(patches.median())
    ratio = float(patches.max()) / max(median, 1e-12)
    if ordinary is None:
        ordinary = ordinary_level(patches, flagged)
    modes = [i for i, lo in enumerate(report.layers) if lo.artifacts_present]
    if before is None:
        known = [
            (i, report.layers[i].cut("auto"), None)
            for i in modes
            if math.isfinite(report.layers[i].cut("auto"))
        ]
    else:
        known = [(b.layer, b.threshold, b.ordinary) for b in before.blocks]
    blocks = [_block_check(trace, *b, tolerance=tolerance) for b in known]
    clean = fix_is_clean(modes, ratio, ordinary, tolerance) and all(b.clean for b in blocks)
    decides = value is None or value > tolerance * ordinary * median
    return FixCheck(
        len(neurons),
        float(flagged.float().mean()),
        float(patches.max()),
        median,
        ratio,
        ordinary,
        modes,
        clean,
        blocks,
        trace,
        decides,
    )


def _block_check(
    trace: NormTrace,
    layer: int,
    threshold: float,
    ordinary: float | None,
    *,
    tolerance: float,
) -> BlockCheck:
    """Block ``layer`` of ``trace`` against its ordinary level before the fix (``ordinary``
    measured here when ``None``: the check without the fix), with the patches above its
    threshold before the fix counted."""
    norms = trace.patch_norms(trace.sites[layer])
    above = norms > threshold
    ordinary = ordinary if ordinary is not None else ordinary_level(norms, above)
    ratio = float(norms.max()) / max(float(norms.median()), 1e-12)
    rate = float(above.float().mean())
    return BlockCheck(
        layer=layer,
        threshold=threshold,
        ordinary=ordinary,
        max_over_median=ratio,
        n_above=int(above.sum()),
        rate_above=rate,
        clean=ratio <= tolerance * ordinary,
    )


@dataclass
class TopKCurve:
    """Per k and resolution: what the fix leaves; the chosen k and whether it is clean."""

    target: float
    tolerance: float
    detect_layer: int
    ks: list[int]
    checks: dict[int, list[FixCheck]]  # resolution (0: native) -> one check per k
    chosen_k: int | None
    status: str = "clean"  # or "partial": no k leaves the model without artifacts
    notes: list[str] = field(default_factory=list)

    def series(self, name: str, size: int = 0) -> list[Any]:
        return [getattr(c, name) for c in self.checks[size]]

    @property
    def outlier_rate(self) -> dict[int, list[float]]:
        return {z: self.series("outlier_rate", z) for z in self.checks}

    @property
    def max_norm(self) -> dict[int, list[float]]:
        return {z: self.series("max_norm", z) for z in self.checks}

    @property
    def median_norm(self) -> dict[int, list[float]]:
        return {z: self.series("median_norm", z) for z in self.checks}

    def _by_size(self, name: str) -> dict[str, list[Any]]:
        """One series per resolution, keyed by the resolution's text (0: native)."""
        return {str(z): self.series(name, z) for z in self.checks}

    def traced(self) -> NormTrace | None:
        """The norms of the images checked under the chosen k's fix, at the native resolution
        (``None`` before k is chosen or where the native resolution was not checked)."""
        if self.chosen_k is None or 0 not in self.checks:
            return None
        return self.checks[0][self.ks.index(self.chosen_k)].trace

    def _keep_chosen_trace(self) -> None:
        """Drop every check's norms but the chosen k's at the native resolution."""
        keep = self.ks.index(self.chosen_k) if self.chosen_k in self.ks else None
        for z, row in self.checks.items():
            for i, c in enumerate(row):
                if z != 0 or i != keep:
                    c.trace = None

    def passes(self, i: int) -> bool:
        """Whether the i-th k passes at every resolution."""
        return all(
            c[i].clean and (c[i].outlier_rate <= self.target or not c[i].rate_decides)
            for c in self.checks.values()
        )

    def calibration(self) -> Calibration:
        """The curve as metrics.json and the NeuronSet record it (resolutions as keys)."""
        assert self.chosen_k is not None, "the curve is summed up once k is chosen"
        by_size = self._by_size
        return Calibration(
            target=self.target,
            tolerance=self.tolerance,
            detect_layer=self.detect_layer,
            ks=self.ks,
            chosen_k=self.chosen_k,
            status=self.status,
            criteria="after the fix: no outlier mode at any block (diagnose presence test), "
            f"max/median patch norm at block {self.detect_layer} <= {self.tolerance:g} x the "
            "ordinary patches' level before the fix, patch outlier rate <= "
            f"{self.target:g} under the discovery threshold where it lies above {self.tolerance:g} "
            "x the ordinary level x the median, and the max/median at every block "
            "that had an outlier mode before the fix within the same tolerance of its own "
            "ordinary level; then no outlier mode at any block and the max/median at block "
            f"{self.detect_layer} within the same tolerance on every image given",
            outlier_rate=by_size("outlier_rate"),
            max_norm=by_size("max_norm"),
            median_norm=by_size("median_norm"),
            max_over_median=by_size("max_over_median"),
            ordinary_max_over_median={
                str(z): c[0].ordinary_max_over_median for z, c in self.checks.items()
            },
            blocks_with_mode=by_size("blocks_with_mode"),
            blocks=by_size("blocks"),
            clean=by_size("clean"),
            notes=self.notes,
        )


@loose_settings("search", NeuronSearch, ("target",))
def calibrate_top_k(
    model: Model,
    neurons: NeuronSet,
    data: Any,
    search: NeuronSearch | None = None,
    *,
    tolerance: float = TOLERANCE,
    ks: Sequence[int] | None = None,
    image_sizes: Sequence[int | None] = (None,),
    batch_size: int = 32,
    limit: int | None = None,
    progress: Update | None = None,
    keep_all: bool = False,
    ttr: TtrSettings | None = None,
    unfixed: FixCheck | None = None,
) -> tuple[NeuronSet, TopKCurve]:
    """The smallest k (first k of ``neurons`` in stored order) whose fix passes everywhere, the
    outlier rate to reach being ``search.target`` (default: that of :class:`NeuronSearch`).

    ``data`` should be held-out images (not those used for discovery). k = 0 is always measured
    first (the "before" and the ordinary level). The curve stops at the first passing k; if none
    does, every k is tried, the one leaving the fewest outlier blocks (then the lowest max/median)
    is returned and the status is "partial". ``keep_all``: the whole set is the choice (a causal
    set, every unit of which was measured to matter) when its fix passes; every k is still
    measured for the curve. ``ttr``: how the fix inserts its registers (default: the paper's).
    ``unfixed``: the k = 0 check of ``data`` at the native resolution, made beforehand with the
    detection ``neurons`` records (:func:`check_fix` with an empty set); taken, not measured.
    """
    search = search if search is not None else NeuronSearch()
    detect, rule, value = _recorded_detection(neurons)
    grid = ks if ks is not None else DEFAULT_KS
    candidates = sorted({0, len(neurons)} | {k for k in grid if 0 <= k <= len(neurons)})
    sizes = [None if z is None else int(z) for z in image_sizes]
    curve = TopKCurve(search.target, tolerance, detect, [], {z or 0: [] for z in sizes}, None)
    for i, k in enumerate(candidates):
        for z in sizes:
            before = curve.checks[z or 0]
            if k == 0 and z is None and unfixed is not None:
                before.append(unfixed)
                continue
            check = check_fix(
                model,
                neurons.first(k),
                data,
                detect,
                rule,
                value,
                ordinary=before[0].ordinary_max_over_median if before else None,
                before=before[0] if before else None,
                tolerance=tolerance,
                size=z,
                batch_size=batch_size,
                limit=limit,
                ttr=ttr,
            )
            before.append(check)
        curve.ks.append(k)
        if progress is not None:
            progress(i + 1)
        if k > 0 and curve.passes(i) and not keep_all:
            curve.chosen_k = k
            break
    _choose(curve, len(neurons), keep_all)
    assert curve.chosen_k is not None
    curve._keep_chosen_trace()
    chosen = neurons.first(curve.chosen_k)
    chosen.settings = {**chosen.settings, "calibration": curve.calibration().model_dump()}
    return chosen, curve


def _recorded_detection(neurons: NeuronSet) -> tuple[int, str, float | None]:
    """The detection layer, outlier rule and threshold value that ``neurons`` records."""
    s = neurons.settings
    detect = s.get("detect_layer")
    if detect is None:
        raise VitregError("this NeuronSet records no detection layer; rediscover or pass one")
    return detect, s.get("threshold", "auto"), s.get("threshold_value")


def _choose(curve: TopKCurve, n: int, keep_all: bool) -> None:
    """Set the curve's chosen k once every k to measure is measured: a kept-whole set of ``n``
    units when it passes (else the first k that does), or the best partial k, said in a note."""
    passing = [k for i, k in enumerate(curve.ks) if k > 0 and curve.passes(i)]
    if keep_all and passing:
        curve.chosen_k = n if n in passing else passing[0]
    if curve.chosen_k is not None:
        return
    curve.status = "partial"
    native = next(iter(curve.checks.values()))
    tried = range(1, len(curve.ks)) or range(len(curve.ks))
    best = min(
        tried,
        key=lambda i: (
            sum(len(c[i].blocks_with_mode) for c in curve.checks.values()),
            native[i].max_over_median,
        ),
    )
    curve.chosen_k = curve.ks[best]
    left = native[best]
    short = _shortfall(left, curve.target, curve.tolerance, curve.detect_layer)
    curve.notes.append(
        f"partial: no k up to {n} passes on the held-out images; the best, k = {left.k}, "
        f"leaves {short}. Search more layers (--highest-layer), use more images, or accept the "
        "residual"
    )


def _shortfall(check: FixCheck, target: float, tolerance: float, detect: int) -> str:
    """What keeps a check from passing, in words."""
    parts = []
    left = [b for b in check.blocks if not b.clean]
    if left:
        parts.append(
            "outliers at blocks "
            + ", ".join(
                f"{b.layer} (max/median {b.max_over_median:.3g}, ordinary "
                f"{b.ordinary:.3g}; {b.n_above} patches above its threshold)"
                for b in left
            )
        )
    if check.blocks_with_mode:
        parts.append(f"an outlier mode at blocks {check.blocks_with_mode}")
    if check.max_over_median > tolerance * check.ordinary_max_over_median:
        parts.append(
            f"max/median {check.max_over_median:.3g} at block {detect} (ordinary level "
            f"{check.ordinary_max_over_median:.3g}, allowed {tolerance:g}x)"
        )
    if check.rate_decides and check.outlier_rate > target:
        parts.append(f"a patch outlier rate of {check.outlier_rate:.2%} (target {target:.2%})")
    return " and ".join(parts) or "nothing (at the native resolution; another one fails)"


def confirm_on(
    model: Model,
    neurons: NeuronSet,
    images: torch.Tensor,
    curve: TopKCurve,
    *,
    batch_size: int = 32,
    ttr: TtrSettings | None = None,
    traced: NormTrace | None = None,
) -> list[int]:
    """The presence test at every block on ``images`` (every image given) with the fix of
    ``neurons`` applied, and the max/median at the detection block against the tolerance of
    the ordinary level (as calibration judges the held-out images); the blocks that show an
    outlier mode. ``traced``: norms of more images under the same fix (the held-out ones, as
    calibration traced them: :meth:`TopKCurve.traced`), pooled after those of ``images``. A
    "clean" ``curve`` whose fix leaves either is "partial" from here on, with a note saying
    what is left."""
    fix = _fix(neurons, ttr)
    norms = NormAnalysis() if traced is None else _PooledNorms(traced)
    with fix.applied(model):
        report = run_analyses(model, images, [norms], batch_size)[0][norms.name].summary
    n = len(images) + (traced.n_images if traced is not None else 0)
    modes = [i for i, lo in enumerate(report.layers) if lo.artifacts_present]
    left = _left_on_all(report, curve, modes)
    if left and curve.status == "clean":
        curve.status = "partial"
        curve.notes.append(
            f"partial: the fix of k = {len(neurons)} passes on the held-out images, but on all "
            f"{n} images given (discovery and held-out) it leaves {left}. Search more layers "
            "(--highest-layer), use more images, or accept the residual"
        )
        neurons.settings = {**neurons.settings, "calibration": curve.calibration().model_dump()}
    return modes


def _left_on_all(report: Norms, curve: TopKCurve, modes: list[int]) -> str:
    """What a fix leaves on every image given, in words ("" when nothing): outlier modes, or a
    max/median at the detection block above the tolerance of the ordinary level before the fix
    (over every image given where known, else the held-out images'): outlier patches on too few
    images to make a mode."""
    parts = [f"an outlier mode at blocks {modes}"] if modes else []
    unfixed = curve.checks[0][0] if curve.checks.get(0) else None
    ordinary = None if unfixed is None else unfixed.ordinary_all or unfixed.ordinary_max_over_median
    ratio = report.layers[curve.detect_layer].max_over_median
    if ordinary is not None and ratio > curve.tolerance * ordinary:
        parts.append(
            f"max/median {ratio:.3g} at block {curve.detect_layer} (ordinary level "
            f"{ordinary:.3g}, allowed {curve.tolerance:g}x)"
        )
    return " and ".join(parts)


class _PooledNorms(NormAnalysis):
    """Token norms at every block output pooled with ``then``'s (norms traced before, under
    the same fix) before the outlier statistics are made, once."""

    def __init__(self, then: NormTrace) -> None:
        super().__init__()
        self.then = then

    def norm_trace(self, model: Model, trace: TraceResult) -> NormTrace:
        """The pass's norms followed by ``then``'s."""
        return pooled(super().norm_trace(model, trace), self.then)


def pooled(first: NormTrace, then: NormTrace) -> NormTrace:
    """The norms of ``first``'s images followed by ``then``'s (traced at the same sites with the
    same token layout)."""
    if first.sites != then.sites or first.layouts != then.layouts:
        raise VitregError("cannot pool norms traced at other sites or with other token layouts")
    norms = {s: torch.cat([first.norms[s], then.norms[s]]) for s in first.norms}
    return NormTrace(
        first.sites, norms, first.layouts, first.final_site, first.n_images + then.n_images
    )
