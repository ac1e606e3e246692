"""The automatic path behind ``vitreg neurons``: split, survey, discovery, causal selection and
calibration, each decision recorded with its evidence.

1. **Split**: every 4th image is held out; discovery never sees it.
2. **Survey** (:mod:`~vitreg.neurons.detection`): emergence layer, searched range 0..E, detection
   layer and threshold, each with its reason.
3. **Discovery** (Algorithm 1 of Jiang et al.) ranks candidates within the range.
4. **Causal selection** (:mod:`~vitreg.neurons.causal`) on held-out images keeps the units whose
   zeroing removes the outliers and drops readers and bystanders.
5. **Calibration** (:mod:`~vitreg.neurons.calibrate`) on held-out images: the smallest k whose fix
   leaves no outlier mode at any block and the max/median patch norm at the ordinary level;
   otherwise the result is "partial", with what is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vitreg import distributed
from vitreg.core.renamed import loose_settings, renamed
from vitreg.errors import InputError, VitregError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.models.model import Model
from vitreg.neurons.calibrate import (
    DEFAULT_KS,
    TOLERANCE,
    FixCheck,
    TopKCurve,
    calibrate_top_k,
)
from vitreg.neurons.causal import CausalSelection
from vitreg.neurons.detection import Detection, choose_detection
from vitreg.neurons.discover import discover
from vitreg.neurons.held_out import HOLD_OUT, HeldOutSplit, causal_set
from vitreg.progress import SILENT, Progress
from vitreg.settings.neurons import NeuronSearch

MIN_HELD_OUT = 2  # held-out images the check needs: one image's content never stands for a model
SPLIT_RULE = "every 4th image (indices 3, 7, 11, ...) held out for the causal check and top-k"
MAX_HELD_OUT = 32  # held-out images used at most (memory and time flat in the image count)
CAUSAL_IMAGES = 16  # held-out images used by the causal check


def split_sizes(n: int) -> tuple[int, int]:
    """(discovery, held-out) image counts for ``n`` images."""
    return n - n // HOLD_OUT, n // HOLD_OUT


def held_out_images(source: Any, cap: int = MAX_HELD_OUT) -> torch.Tensor:
    """The first ``cap`` held-out images as one tensor."""
    out: list[torch.Tensor] = []
    have = 0
    for batch in HeldOutSplit(source, held_out=True):
        out.append(batch[: cap - have])
        have += out[-1].shape[0]
        if have >= cap:
            break
    if not out:
        raise InputError("no held-out images: pass at least 4 images")
    return torch.cat(out)


@dataclass
class NeuronSearchResult:
    """Discovery, causal selection and top-k calibration on one image source."""

    ranking: NeuronSet  # every ranked candidate, best first
    chosen: NeuronSet  # the set to apply, in selection order
    detection: Detection
    causal: CausalSelection | None  # None with a fixed top-k or causal=False
    curve: TopKCurve
    held_out: dict[str, Any]  # k = 0 vs the chosen k on held-out images
    split: dict[str, Any]
    mode: str  # "calibrated" or "fixed" (top-k given)
    stability: dict[str, Any] | None = None  # the sets of two halves of the images (opt-in)
    other_sizes: dict[str, Any] | None = None  # the fix checked at other resolutions (opt-in)

    @property
    def status(self) -> str:
        return self.curve.status

    def results(self) -> dict[str, Any]:
        """The ``results`` block of a neurons run's metrics.json."""
        d = self.detection
        curve = self.curve.to_dict()
        return {
            "n_neurons": len(self.chosen),
            "chosen_k": len(self.chosen),
            "top_k_mode": self.mode,
            "selection": "causal" if self.causal is not None else "score",
            "status": self.status,
            "target": self.curve.target,
            "tolerance": self.curve.tolerance,
            "detect_layer": d.detect_layer,
            "highest_layer": d.highest_layer,
            "lowest_layer": d.lowest_layer,
            "threshold": d.threshold,
            "threshold_value": d.threshold_value,
            "emergence_layer": d.emergence_layer,
            "reasons": d.reasons,
            "survey": d.layers,
            "layers": layer_counts(self.chosen),
            "neurons": neuron_rows(self.chosen, self.causal),
            "ranking": neuron_rows(self.ranking),
            "causal": self.causal.to_dict() if self.causal is not None else None,
            "held_out": self.held_out,
            "calibration": curve if self.mode == "calibrated" else None,
            "discovery": self.ranking.data,
            "notes": list(self.curve.notes),
            "stability": self.stability,
            "other_sizes": self.other_sizes,
        }


def neuron_rows(neurons: NeuronSet, causal: CausalSelection | None = None) -> list[dict[str, Any]]:
    """One row per neuron: layer, unit, discovery score, and its causal effects when measured."""
    rows = []
    for layer, unit, score in zip(neurons.layers, neurons.units, neurons.scores, strict=True):
        row: dict[str, Any] = {"layer": layer, "unit": unit, "score": score}
        if causal is not None and (layer, unit) in causal.effects:
            e = causal.effects[(layer, unit)]
            row.update(
                effect_alone=e["alone"],
                effect_in_set=e["in_set"],
                effect_alone_at_emergence=e["alone_at_emergence"],
                persistence=e["persistence"],
            )
        rows.append(row)
    return rows


def layer_counts(neurons: NeuronSet) -> list[dict[str, int]]:
    return [{"layer": k, "n_neurons": len(v)} for k, v in neurons.by_layer().items()]


@loose_settings(
    "search", NeuronSearch, ("top_k", "target", "detect_layer", "highest_layer", "threshold")
)
def find_neurons(
    model: Model,
    images: Any,
    search: NeuronSearch | None = None,
    *,
    n_images: int | None = None,
    batch_size: int = 32,
    causal: bool = True,
    tolerance: float = TOLERANCE,
    max_held_out: int = MAX_HELD_OUT,
    causal_images: int = CAUSAL_IMAGES,
    stability: bool = False,
    check_sizes: Sequence[int] = (),
    progress: Progress = SILENT,
) -> NeuronSearchResult:
    """Register neurons of ``model`` from preprocessed ``images`` with nothing to set by hand.

    ``search`` (a :class:`~vitreg.settings.neurons.NeuronSearch`; default: every choice made
    from the images) carries the target, top-k, detection layer, highest searched layer and
    threshold. Its ``top_k='auto'`` chooses k (causal selection, then calibration); a number
    keeps the top ``top_k`` of the paper's ranking instead, and the fix it makes is still
    checked on held-out images. ``n_images`` is the image count when ``images`` has no ``len``
    (a stream). ``stability``: also choose the causal set from each half of the discovery
    images and report their overlap (:mod:`~vitreg.neurons.stability`; about twice the cost of
    the selection). ``check_sizes``: image sizes at which the chosen set's fix is also checked
    (the held-out images resized), since register neurons can be resolution-specific.
    """
    search = search if search is not None else NeuronSearch()
    _check_sizes_taken(model, check_sizes)  # before any work: a refused size fails now
    disc, n_disc = _discovery_split(images, n_images)
    detection, ranking = _survey_and_rank(model, disc, n_disc, search, batch_size, progress)
    # Under torchrun the survey and discovery above are sharded over the ranks (one sharded
    # Model.trace, all-reduced sums). The held-out steps below run on a small tensor (at most
    # ``max_held_out`` images): every rank runs them whole, on the same images with the same
    # weights, and gets the same result -- simpler than sharding them.
    held = held_out_images(images, max_held_out)
    selection = None
    if search.top_k == "auto" and causal:
        selection = _causal_selection(
            model, held[:causal_images], ranking, detection, batch_size, progress
        )
    order, ks = _calibration_order(ranking, selection, search)
    chosen, curve = _calibrate(
        model, order, held, ks, selection is not None, search, tolerance, batch_size, progress
    )
    before, after = curve.checks[0][0], curve.checks[0][curve.ks.index(curve.chosen_k)]
    if search.top_k == "auto" and before.clean and before.outlier_rate <= search.target:
        raise InputError(
            f"the {len(held)} held-out images show no artifacts without any fix (no outlier "
            f"mode at any block, patch outlier rate {before.outlier_rate:.2%}) at block "
            f"{detection.detect_layer}, so top-k cannot be chosen on them; use more images "
            "(--limit, --images DIR) or a fixed --top-k K"
        )
    chosen.settings = {
        **chosen.settings,
        "selection": selection.to_dict() if selection is not None else None,
        "status": curve.status,
    }
    split = {"rule": SPLIT_RULE, "n_discovery": ranking.data["n_images"], "n_held_out": len(held)}
    mode = "fixed" if search.top_k != "auto" else "calibrated"
    summary = _held_out_summary(held, chosen, before, after)
    found = NeuronSearchResult(ranking, chosen, detection, selection, curve, summary, split, mode)
    if stability and selection is not None:
        found.stability = _half_sets(
            model, disc, held[:causal_images], detection, selection, search, batch_size, progress
        )
    if check_sizes:
        found.other_sizes = _other_sizes(
            model, chosen, held, check_sizes, search, tolerance, batch_size, progress
        )
    return found


def _check_sizes_taken(model: Model, sizes: Sequence[int]) -> None:
    """Refuse, naming it, an image size the model cannot take."""
    for size in sizes:
        try:
            model.layout_for((size, size))
        except InputError as e:
            raise InputError(f"cannot check the fix at {size} px: {e}") from None


def _discovery_split(images: Any, n_images: int | None) -> tuple[HeldOutSplit, int]:
    """The images discovery sees and their count, once enough are held out for the check."""
    total = n_images if n_images is not None else len(images)
    n_disc, n_held = split_sizes(total)
    if n_held < MIN_HELD_OUT:
        if not isinstance(images, torch.Tensor):
            for _ in images:  # a source none of whose files is an image says so while read
                pass
        raise InputError(
            f"discovery holds out every {HOLD_OUT}th image to check the neurons it finds, and "
            f"the check needs at least {MIN_HELD_OUT} of them, so that the patches of one image "
            f"(a photo that is mostly sky, say) never stand for the model: at least "
            f"{MIN_HELD_OUT * HOLD_OUT} images, and got {total} ({n_held} held out); pass more "
            "(--limit, --images DIR)"
        )
    return HeldOutSplit(images, held_out=False), n_disc


def _survey_and_rank(
    model: Model,
    disc: HeldOutSplit,
    n_disc: int,
    search: NeuronSearch,
    batch_size: int,
    progress: Progress,
) -> tuple[Detection, NeuronSet]:
    """The survey (detection layer, threshold, searched range) and discovery's ranking."""
    with progress(None, "surveying patch norms per block"):
        detection = choose_detection(model, disc, search, batch_size=batch_size)
    with progress(n_disc, "discovering register neurons (images)") as update:
        ranking = discover(
            model, disc, search, detection=detection, batch_size=batch_size, progress=update
        )
    return detection, ranking


def _causal_selection(
    model: Model,
    held: torch.Tensor,
    ranking: NeuronSet,
    detection: Detection,
    batch_size: int,
    progress: Progress,
) -> CausalSelection:
    """The causal check on ``held``: the ranked units whose zeroing removes the outliers."""
    with (
        progress(
            None, "causal check: zeroing candidates on held-out images (rounds of candidates)"
        ) as update,
        distributed.local(),
    ):
        selection = causal_set(model, held, ranking, detection, batch_size, progress=update)
    if selection.baseline["n_outlier_patches"] == 0:
        raise InputError(
            f"the {len(held)} held-out images checked have no outlier "
            f"patch at block {detection.detect_layer}, so the causal check has nothing to "
            "remove; use more images (--limit, --images DIR) or a fixed --top-k K"
        )
    if not selection.chosen:
        raise VitregError(
            f"no candidate unit in blocks {detection.lowest_layer}-{detection.highest_layer} "
            f"removes the outliers at block {detection.detect_layer} when zeroed; they may be "
            "written by attention or by units outside this range: pass --highest-layer, or "
            "a fixed --top-k to apply the paper's ranking as it is"
        )
    return selection


def _calibration_order(
    ranking: NeuronSet, selection: CausalSelection | None, search: NeuronSearch
) -> tuple[NeuronSet, tuple[int, ...]]:
    """The candidates in the order calibration takes them, and the values of k to check: a
    fixed top-k's ranking whole, the causal set whole (the curve over k only if it fails), or
    the ranking over :data:`DEFAULT_KS`."""
    if search.top_k != "auto":
        order, ks = ranking, (0, len(ranking))
    elif selection is not None:
        order = _ordered(ranking, selection.chosen)
        ks = (0, len(order))
    else:
        order, ks = ranking, DEFAULT_KS
    return order, tuple(k for k in ks if k <= len(order)) + (len(order),)


def _calibrate(
    model: Model,
    order: NeuronSet,
    held: torch.Tensor,
    ks: tuple[int, ...],
    keep_all: bool,
    search: NeuronSearch,
    tolerance: float,
    batch_size: int,
    progress: Progress,
) -> tuple[NeuronSet, TopKCurve]:
    """The fix checked on ``held`` at each of ``ks``; a causal set (``keep_all``) whose fix
    leaves artifacts is checked at every k of :data:`DEFAULT_KS` instead."""
    with (
        progress(len(set(ks)), "checking the fix on held-out images (values of top-k)") as update,
        distributed.local(),
    ):
        chosen, curve = calibrate_top_k(
            model,
            order,
            held,
            search,
            tolerance=tolerance,
            ks=ks,
            batch_size=batch_size,
            progress=update,
            keep_all=keep_all,
        )
    if keep_all and curve.status == "partial" and len(order) > 1:
        with (
            progress(
                len(DEFAULT_KS), "checking the fix at each k (values of top-k) on held-out images"
            ) as update,
            distributed.local(),
        ):
            chosen, curve = calibrate_top_k(
                model,
                order,
                held,
                search,
                tolerance=tolerance,
                ks=DEFAULT_KS,
                batch_size=batch_size,
                progress=update,
                keep_all=True,
            )
    return chosen, curve


def _held_out_summary(
    held: torch.Tensor, chosen: NeuronSet, before: FixCheck, after: FixCheck
) -> dict[str, Any]:
    """The held-out images with no fix (k = 0) and with the chosen one, as metrics.json has it."""
    summary: dict[str, Any] = {"n_images": len(held), "k": len(chosen)}
    for when, check in (("before", before), ("after", after)):
        summary.update(
            {
                f"outlier_rate_{when}": check.outlier_rate,
                f"max_patch_norm_{when}": check.max_norm,
                f"median_patch_norm_{when}": check.median_norm,
                f"max_over_median_{when}": check.max_over_median,
                f"blocks_with_outlier_mode_{when}": check.blocks_with_mode,
            }
        )
    summary["ordinary_max_over_median"] = before.ordinary_max_over_median
    return summary


def _half_sets(
    model: Model,
    disc: HeldOutSplit,
    held: torch.Tensor,
    detection: Detection,
    selection: CausalSelection,
    search: NeuronSearch,
    batch_size: int,
    progress: Progress,
) -> dict[str, Any]:
    """The stability check: the causal set of each half of the discovery images."""
    from vitreg.neurons.stability import half_sets

    with (
        progress(2, "stability: the causal set of each half of the images"),
        distributed.local(),
    ):
        return half_sets(
            model, disc, held, detection, selection.chosen, search, batch_size=batch_size
        )


def _other_sizes(
    model: Model,
    chosen: NeuronSet,
    held: torch.Tensor,
    sizes: Sequence[int],
    search: NeuronSearch,
    tolerance: float,
    batch_size: int,
    progress: Progress,
) -> dict[str, Any]:
    """The chosen set's fix checked on ``held`` resized to each of ``sizes``."""
    from vitreg.neurons.stability import other_sizes

    with (
        progress(None, f"checking the fix at sizes {', '.join(map(str, sizes))}"),
        distributed.local(),
    ):
        return other_sizes(
            model, chosen, held, list(sizes), search, tolerance=tolerance, batch_size=batch_size
        )


def _ordered(ranking: NeuronSet, units: list[tuple[int, int]]) -> NeuronSet:
    """``units`` (a subset of the ranking) in the given order, with their discovery scores."""
    index = {pair: i for i, pair in enumerate(ranking.pairs())}
    return ranking.pick([index[u] for u in units])


__getattr__ = renamed(__name__, {"Found": "NeuronSearchResult"}, globals())
