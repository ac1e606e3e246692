"""The automatic path behind ``vitreg neurons``: split, survey, discovery, causal selection and
calibration, each decision recorded with its evidence.

1. **Split**: every 4th image is held out; discovery never sees it. When those the causal check
   looks at show no outlier patch at the detection block, or all pass the fix's own test with no
   fix (they cannot judge one), every 4th surveyed discovery image with an outlier patch is held
   out instead (before discovery).
2. **Survey** (:mod:`~vitreg.neurons.detection`): emergence layer, searched range 0..E, detection
   layer and threshold, each with its reason.
3. **Discovery** (Algorithm 1 of Jiang et al.) ranks candidates within the range.
4. **Causal selection** (:mod:`~vitreg.neurons.causal`) on held-out images keeps the units whose
   zeroing removes the outliers and drops readers, bystanders and units whose write points
   across the outliers; units that write what a kept unit writes, on the same patches (its
   siblings), join last.
5. **Calibration** (:mod:`~vitreg.neurons.calibrate`) on held-out images: the smallest k whose fix
   leaves no outlier mode at any block and the max/median patch norm at the ordinary level;
   otherwise the result is "partial", with what is left. "Clean" is said only when the fix also
   leaves no outlier mode at any block on every image given (discovery and held-out), and the
   max/median at the detection layer over them all at the ordinary level.
6. **More evidence**: a partial fix that leaves outlier patches on surveyed discovery images
   shows that the few held-out images missed part of the circuit; those images are held out too
   and steps 4-5 run again, the new choice given when it is clean on every image or, partial
   too, when its fix leaves fewer outlier patches on them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from pydantic import PrivateAttr

from vitreg import distributed
from vitreg.analysis.norms import NormTrace
from vitreg.analysis.rules import image_mask, ordinary_level
from vitreg.core.renamed import loose_settings, renamed
from vitreg.errors import InputError, VitregError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.hooks.names import hook_name
from vitreg.models.model import Model, iter_batches
from vitreg.neurons.calibrate import (
    DEFAULT_KS,
    TOLERANCE,
    FixCheck,
    TopKCurve,
    calibrate_top_k,
    check_fix,
    confirm_on,
)
from vitreg.neurons.causal import siblings_in
from vitreg.neurons.detection import surveyed_detection
from vitreg.neurons.discover import BLOCK_K, DISCOVER_K, discover
from vitreg.neurons.held_out import HOLD_OUT, HeldOutSplit, causal_set
from vitreg.progress import SILENT, Progress
from vitreg.results.neurons import (
    Causal,
    DetectionRecord,
    Discovered,
    Discovery,
    HeldOut,
    LayerCount,
    NeuronRow,
    OtherSizes,
    Stability,
)
from vitreg.settings.neurons import NeuronSearch

MIN_HELD_OUT = 2  # held-out images the check needs: one image's content never stands for a model
SPLIT_RULE = "every 4th image (indices 3, 7, 11, ...) held out for the causal check and top-k"
MAX_HELD_OUT = 32  # held-out images used at most (memory and time flat in the image count)
CAUSAL_IMAGES = 16  # held-out images used by the causal check
SURVEY_IMAGES = 32  # discovery images the survey traces (and the final check sees again)


def split_sizes(n: int) -> tuple[int, int]:
    """(discovery, held-out) image counts for ``n`` images."""
    return n - n // HOLD_OUT, n // HOLD_OUT


def held_out_images(
    source: Any,
    cap: int = MAX_HELD_OUT,
    held_out: bool = True,
    moved: frozenset[int] = frozenset(),
) -> torch.Tensor:
    """The first ``cap`` held-out images (or discovery images) as one tensor; ``moved``: source
    indices that change side."""
    disc, held = first_images(source, 0 if held_out else cap, cap if held_out else 0, moved)
    return held if held_out else disc


def first_images(
    source: Any, n_disc: int, n_held: int, moved: frozenset[int] = frozenset()
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n_disc`` discovery images and the first ``n_held`` held-out ones, read in
    one pass over the start of ``source``; ``moved``: source indices that change side."""
    parts: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    caps, have = (n_disc, n_held), [0, 0]
    for pair in HeldOutSplit(source, held_out=True, moved=moved).sides():
        for i, batch in enumerate(pair):
            parts[i].append(batch[: caps[i] - have[i]])
            have[i] += parts[i][-1].shape[0]
        if have[0] >= n_disc and have[1] >= n_held:
            break
    if (n_held and not have[1]) or (n_disc and not have[0]):
        raise InputError("no held-out images: pass at least 4 images")
    disc, held = (torch.cat(p) if p else torch.empty(0) for p in parts)
    return disc, held


class NeuronSearchResult(Discovered):
    """Discovery, causal selection and top-k calibration on one image source: the typed
    results (as metrics.json holds them), with what they describe riding along unserialised:
    the chosen and the ranked NeuronSets and the survey that placed the search."""

    _chosen: NeuronSet = PrivateAttr()
    _ranked: NeuronSet = PrivateAttr()
    _detection: DetectionRecord = PrivateAttr()

    def riding(
        self, chosen: NeuronSet, ranked: NeuronSet, detection: DetectionRecord
    ) -> NeuronSearchResult:
        """These results with the sets and the survey they describe; ``self``."""
        self._chosen, self._ranked, self._detection = chosen, ranked, detection
        return self

    @property
    def chosen(self) -> NeuronSet:
        """The set to apply, in selection order."""
        return self._chosen

    @property
    def ranked(self) -> NeuronSet:
        """Every ranked candidate, best first."""
        return self._ranked

    @property
    def detection(self) -> DetectionRecord:
        """The survey: detection layer, threshold, searched blocks and the growth curve."""
        return self._detection

    @property
    def split(self) -> dict[str, str | int | None]:
        """Which images discovery saw and which were held out, as the data block records it."""
        return {
            "rule": SPLIT_RULE,
            "n_discovery": self.discovery.n_images,
            "n_held_out": self.held_out.n_images,
        }


def neuron_rows(neurons: NeuronSet, causal: Causal | None = None) -> list[NeuronRow]:
    """One row per neuron: layer, unit, discovery score, and its causal effects when measured."""
    rows = []
    for layer, unit, score in zip(neurons.layers, neurons.units, neurons.scores, strict=True):
        e = causal.effect(layer, unit) if causal is not None else None
        measured = (
            {}
            if e is None
            else {
                "effect_alone": e.alone,
                "effect_in_set": e.in_set,
                "effect_alone_at_emergence": e.alone_at_emergence,
                "persistence": e.persistence,
            }
        )
        rows.append(NeuronRow(layer=layer, unit=unit, score=score, **measured))
    return rows


def layer_counts(neurons: NeuronSet) -> list[LayerCount]:
    """How many neurons of ``neurons`` each block holds, in block order."""
    return [LayerCount(layer=k, n_neurons=len(v)) for k, v in neurons.by_layer().items()]


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
    first, held = first_images(images, SURVEY_IMAGES, max_held_out)  # first: for the last check
    with progress(None, "surveying patch norms per block"):
        detection, surveyed = surveyed_detection(
            model, first, search, n_images=SURVEY_IMAGES, batch_size=batch_size, more=held
        )
    unfixed = _unfixed(model, held, detection, tolerance, batch_size, progress)
    looked = causal_images if causal else None
    moved, why = _to_hold_out(disc, n_disc, surveyed, unfixed, detection, search, looked)
    if moved:  # before discovery, which never sees them
        disc, n_disc = disc.moving(frozenset(moved)), n_disc - len(moved)
        first, held = first_images(images, SURVEY_IMAGES, max_held_out, disc.moved)
        unfixed = _unfixed(model, held, detection, tolerance, batch_size, progress)
    unfixed.ordinary_all = _ordinary_all(surveyed, len(first), unfixed, detection)
    # one discovery pass ranks the wider set too; the first choice takes its top-k prefix
    widen = search.top_k == "auto" and causal
    wider = _rank(model, disc, n_disc, detection, search, batch_size, progress, widen * BLOCK_K)
    ranking = wider.first(DISCOVER_K) if widen else wider
    # Under torchrun the survey and discovery above are sharded over the ranks (one sharded
    # Model.trace, all-reduced sums). The held-out steps below run on a small tensor (at most
    # ``max_held_out`` images): every rank runs them whole, on the same images with the same
    # weights, and gets the same result -- simpler than sharding them.
    knobs = _Knobs(causal_images, tolerance, batch_size, progress)
    choice = _choose(model, first, held, ranking, detection, search, causal, knobs, unfixed)
    widened = None
    if choice.curve.status == "partial" and len(wider) > len(ranking):
        try:
            again = _choose(model, first, held, wider, detection, search, causal, knobs, unfixed)
        except VitregError:
            again = None
        widened = again is not None and again.curve.status == "clean"
        if widened:
            ranking, choice = wider, again
    evidence = None
    if choice.curve.status == "partial" and search.top_k == "auto" and causal:
        evidence = _with_left(model, first, held, ranking, detection, search, knobs, choice, disc)
        if evidence.given:
            choice, held = evidence.choice, evidence.held
    selection, chosen, curve = choice.selection, choice.chosen, choice.curve
    before, after = curve.checks[0][0], curve.checks[0][curve.ks.index(curve.chosen_k)]
    chosen.settings = {
        **chosen.settings,
        "selection": selection.model_dump(exclude_unset=True) if selection is not None else None,
        "status": curve.status,
    }
    found = _results(chosen, ranking, detection, selection, curve, search, held, before, after)
    if moved:
        found.notes.insert(0, _moved_note(moved, why, held))
    if widened is not None:
        found.notes.append(_widened_note(widened, detection))
    if evidence is not None and evidence.note:
        found.notes.append(evidence.note)
    if stability and selection is not None:
        found.stability = _half_sets(
            model, disc, held[:causal_images], detection, selection, search, batch_size, progress
        )
    if check_sizes:
        found.other_sizes = _other_sizes(
            model, chosen, held, check_sizes, search, tolerance, batch_size, progress
        )
    return found.riding(chosen, ranking, detection)


def _results(
    chosen: NeuronSet,
    ranking: NeuronSet,
    detection: DetectionRecord,
    selection: Causal | None,
    curve: TopKCurve,
    search: NeuronSearch,
    held: torch.Tensor,
    before: FixCheck,
    after: FixCheck,
) -> NeuronSearchResult:
    """The results of the search: the chosen set, how it was chosen, what its fix leaves."""
    d = detection
    return NeuronSearchResult(
        status=curve.status,
        n_neurons=len(chosen),
        chosen_k=len(chosen),
        top_k_mode="fixed" if search.top_k != "auto" else "calibrated",
        selection="causal" if selection is not None else "score",
        target=curve.target,
        tolerance=curve.tolerance,
        detect_layer=d.detect_layer,
        highest_layer=d.highest_layer,
        lowest_layer=d.lowest_layer,
        threshold=d.threshold,
        threshold_value=d.threshold_value,
        emergence_layer=d.emergence_layer,
        reasons=d.reasons,
        survey=d.layers,
        layers=layer_counts(chosen),
        neurons=neuron_rows(chosen, selection),
        ranking=neuron_rows(ranking),
        causal=selection,
        held_out=_held_out(held, chosen, before, after),
        calibration=curve.calibration() if search.top_k == "auto" else None,
        discovery=Discovery.model_validate(ranking.data),
        notes=list(curve.notes),
    )


def _confirm(
    model: Model,
    chosen: NeuronSet,
    disc: torch.Tensor,
    held: torch.Tensor,
    curve: TopKCurve,
    batch_size: int,
    progress: Progress,
) -> None:
    """The presence test with the chosen fix on the surveyed discovery images ``disc`` and the
    held-out ones together (theirs as calibration traced them); a mode left there makes a
    "clean" curve "partial"."""
    if curve.status != "clean":
        return
    traced = curve.traced()
    every = disc if traced is not None else torch.cat([disc, held])
    with (
        progress(None, f"checking the fix on all {len(disc) + len(held)} images at every block"),
        distributed.local(),
    ):
        confirm_on(model, chosen, every, curve, batch_size=batch_size, traced=traced)


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


def _unfixed(
    model: Model,
    held: torch.Tensor,
    detection: DetectionRecord,
    tolerance: float,
    batch_size: int,
    progress: Progress,
) -> FixCheck:
    """The held-out images without a fix (calibration's k = 0, measured before discovery)."""
    where = (detection.detect_layer, detection.threshold, detection.threshold_value)
    empty = NeuronSet.from_pairs([], model)
    with (
        progress(None, "checking the fix on held-out images (k = 0: no fix)"),
        distributed.local(),
    ):
        return check_fix(model, empty, held, *where, tolerance=tolerance, batch_size=batch_size)


def _ordinary_all(
    surveyed: NormTrace, n: int, unfixed: FixCheck, detection: DetectionRecord
) -> float:
    """The ordinary patches' max/median at the detection block over the first ``n`` surveyed
    images and the held-out ones, unfixed: the level the fix is held to on every image given
    (the largest ordinary patch of 40 images lies above that of 8)."""
    assert unfixed.trace is not None, "a check keeps its norms until calibration chooses k"
    where = (detection.detect_layer, detection.threshold, detection.threshold_value)
    site = surveyed.sites[detection.detect_layer]
    patches = [surveyed.patch_norms(site)[:n], unfixed.trace.patch_norms(site)]
    flagged = [_outlier_patches(surveyed, *where)[:n], _outlier_patches(unfixed.trace, *where)]
    return ordinary_level(torch.cat(patches), torch.cat(flagged))


def _carries(check: FixCheck, detection: DetectionRecord, n: int | None) -> torch.Tensor:
    """Per image of the first ``n`` (``None``: all) of a check: whether a patch is above the
    detection threshold at the detection block (from the check's own norms)."""
    assert check.trace is not None, "a check keeps its norms until calibration chooses k"
    where = (detection.detect_layer, detection.threshold, detection.threshold_value)
    return _outlier_images(check.trace, *where)[:n]


def _outlier_images(trace: NormTrace, layer: int, rule: str, value: float | None) -> torch.Tensor:
    """Per image of ``trace``: whether a patch is an outlier at block ``layer``."""
    return _outlier_patches(trace, layer, rule, value).any(1)


def _outlier_patches(trace: NormTrace, layer: int, rule: str, value: float | None) -> torch.Tensor:
    """``[n_images, n_patches]``: which patches of ``trace`` are outliers at block ``layer``."""
    site = trace.sites[layer]
    return image_mask(trace.norms[site], rule, value)[:, trace.layouts[site].patches]


def _carriers(
    disc: HeldOutSplit, n_disc: int, surveyed: NormTrace, detection: DetectionRecord
) -> list[int]:
    """Source indices of surveyed discovery images with outlier patches to hold out instead,
    when the held-out images checked have none: every ``HOLD_OUT``-th of them (at least one),
    and none unless discovery keeps one. Whether the unmodified model shows outliers on an
    image fits nothing to it."""
    n = min(n_disc, SURVEY_IMAGES)  # the survey's first images: discovery's first
    flags = _outlier_images(
        surveyed, detection.detect_layer, detection.threshold, detection.threshold_value
    )[:n]
    carriers = [disc.source_index(int(j)) for j in flags.nonzero().flatten()]
    if len(carriers) < 2:
        return []
    return carriers[HOLD_OUT - 1 :: HOLD_OUT] or carriers[-1:]


def _to_hold_out(
    disc: HeldOutSplit,
    n_disc: int,
    surveyed: NormTrace,
    unfixed: FixCheck,
    detection: DetectionRecord,
    search: NeuronSearch,
    looked: int | None,
) -> tuple[list[int], str]:
    """The surveyed discovery images to hold out as well (source indices) when top-k is chosen
    on held-out images and they cannot judge a fix, and why: the first ``looked`` of them
    (``None``: all) show no outlier patch at the detection block, or all of them pass the fix's
    own test with no fix (no outlier mode, max/median at the ordinary level); none otherwise."""
    if search.top_k != "auto":
        return [], ""
    detect = detection.detect_layer
    if not _carries(unfixed, detection, looked).any():
        why = f"the held-out images checked first showed no outlier patch at block {detect}"
    elif unfixed.clean:
        why = (
            "the held-out images passed the fix's own test with no fix (no outlier mode at any "
            f"block, max/median {unfixed.max_over_median:.3g} at block {detect} against the "
            f"ordinary level {unfixed.ordinary_max_over_median:.3g}), so they could not judge "
            "a fix"
        )
    else:
        return [], ""
    return _carriers(disc, n_disc, surveyed, detection), why


def _moved_note(moved: list[int], why: str, held: torch.Tensor) -> str:
    """What the held-out images are when some discovery images were held out instead."""
    return (
        f"{why}, so {len(moved)} of the surveyed discovery images that show an outlier patch "
        f"(images {moved}, counted from 0 in the order given) were held out instead, before "
        f"discovery; {len(held)} images held out"
    )


def _rank(
    model: Model,
    disc: HeldOutSplit,
    n_disc: int,
    detection: DetectionRecord,
    search: NeuronSearch,
    batch_size: int,
    progress: Progress,
    per_block: int = 0,
) -> NeuronSet:
    """Discovery's ranking over the discovery images, in the surveyed range (``per_block``:
    with the best of each block from the first written one, see :func:`discover`)."""
    with progress(n_disc, "discovering register neurons (images)") as update:
        return discover(
            model,
            disc,
            search,
            detection=detection,
            batch_size=batch_size,
            per_block=per_block,
            progress=update,
        )


class _Knobs(NamedTuple):
    """The run's sizes and progress, as a choice of units uses them."""

    causal_images: int
    tolerance: float
    batch_size: int
    progress: Progress


class _Choice(NamedTuple):
    """One choice of units: the causal selection (``None`` without), the set and its curve."""

    selection: Causal | None
    chosen: NeuronSet
    curve: TopKCurve


def _choose(
    model: Model,
    first: torch.Tensor,
    held: torch.Tensor,
    ranking: NeuronSet,
    detection: DetectionRecord,
    search: NeuronSearch,
    causal: bool,
    knobs: _Knobs,
    unfixed: FixCheck,
) -> _Choice:
    """Units of ``ranking`` chosen on ``held`` (causal selection, then top-k calibration) and
    their fix confirmed on ``first`` and ``held`` together."""
    batch_size, progress = knobs.batch_size, knobs.progress
    selection = None
    if search.top_k == "auto" and causal:
        selection = _causal_selection(
            model, held[: knobs.causal_images], ranking, detection, batch_size, progress
        )
    order, ks = _calibration_order(ranking, selection, search)
    chosen, curve = _calibrate(
        model,
        order,
        held,
        ks,
        selection is not None,
        search,
        knobs.tolerance,
        batch_size,
        progress,
        unfixed,
    )
    before = curve.checks[0][0]
    if search.top_k == "auto" and before.clean and before.outlier_rate <= search.target:
        raise InputError(
            f"the {len(held)} held-out images show no artifacts without any fix (no outlier "
            f"mode at any block, patch outlier rate {before.outlier_rate:.2%}) at block "
            f"{detection.detect_layer}, so top-k cannot be chosen on them; use more images "
            "(--limit, --images DIR) or a fixed --top-k K"
        )
    _confirm(model, chosen, first, held, curve, batch_size, progress)
    return _Choice(selection, chosen, curve)


class _Evidence(NamedTuple):
    """The choice made again with the surveyed discovery images its fix failed on held out
    too: that choice, its held-out images, whether it is given, and the note saying so."""

    choice: _Choice | None
    held: torch.Tensor
    given: bool
    note: str


def _with_left(
    model: Model,
    first: torch.Tensor,
    held: torch.Tensor,
    ranking: NeuronSet,
    detection: DetectionRecord,
    search: NeuronSearch,
    knobs: _Knobs,
    choice: _Choice,
    disc: HeldOutSplit,
) -> _Evidence:
    """A partial choice made again on more evidence: the held-out images stood for the model,
    and a fix that leaves outliers on surveyed discovery images shows that they missed part of
    what writes them. Up to half of :data:`CAUSAL_IMAGES` of those images join the held-out
    ones (first, so that the causal check sees them). The new choice is given when it is clean
    on every image (the rest of the surveyed discovery images and the new held-out ones), or,
    partial too, when its fix leaves fewer outlier patches on all the images."""
    left = _left_on(model, choice.chosen, first, detection, knobs, choice.curve)
    index = (left > 0).nonzero().flatten()[: max(knobs.causal_images // 2, 1)]
    if not len(index):
        return _Evidence(None, held, False, "")
    rest = torch.ones(len(first), dtype=torch.bool)
    rest[index] = False
    more = torch.cat([first[index], held])
    where = (knobs.tolerance, knobs.batch_size, knobs.progress)
    try:
        unfixed = _unfixed(model, more, detection, *where)
        unfixed.ordinary_all = choice.curve.checks[0][0].ordinary_all  # the same images
        again = _choose(model, first[rest], more, ranking, detection, search, True, knobs, unfixed)
    except VitregError:
        again = None
    images = [disc.source_index(int(j)) for j in index]
    said = (
        f"the fix left outlier patches on surveyed discovery images {images} (counted from 0 in "
        "the order given), so causal selection and calibration ran again with them held out "
        "too: "
    )
    if again is None:
        return _Evidence(None, held, False, said + "that found no choice, so the first is given")
    if again.curve.status == "clean":
        said += f"that choice is clean on all images and is the one given ({len(more)} held out)"
        return _Evidence(again, more, True, said)
    # the first choice's count on the surveyed images is ``left``: only the held-out ones are new
    then = int(
        left.sum() + _left_on(model, choice.chosen, held, detection, knobs, choice.curve).sum()
    )
    every = torch.cat([first, held])
    now = int(_left_on(model, again.chosen, every, detection, knobs, again.curve).sum())
    said += (
        f"that choice is not clean either; its fix leaves {now} outlier patches on the "
        f"{len(every)} images against the first's {then}, so the "
        + ("second is given" if now < then else "first is given")
    )
    return _Evidence(again, more, now < then, said)


def _left_on(
    model: Model,
    chosen: NeuronSet,
    images: torch.Tensor,
    detection: DetectionRecord,
    knobs: _Knobs,
    curve: TopKCurve,
) -> torch.Tensor:
    """Per image of ``images``: the outlier patches ``chosen``'s fix leaves at the detection
    block (the survey's rule; a rule that cuts each image on its own flags some in most
    images, so there they count only where the image's max/median also passes the
    calibration's bar: the tolerance times the ordinary patches' level)."""
    site = hook_name(detection.detect_layer, "hook_resid_post")
    per_image = detection.threshold not in ("auto", "absolute")
    bar = knobs.tolerance * curve.checks[0][0].ordinary_max_over_median if per_image else 0.0
    flags = []
    with TestTimeRegisters(chosen).applied(model), distributed.local():
        for batch in iter_batches(images, knobs.batch_size):
            _, cache = model.run_with_cache(batch, names=site, reduce="norm")
            norms = cache.layout(site).take(cache[site], "patches")
            above = image_mask(norms, detection.threshold, detection.threshold_value).sum(1)
            flags.append(above * (norms.amax(1) > bar * norms.median(1).values))
    return torch.cat(flags)


def _widened_note(widened: bool, detection: DetectionRecord) -> str:
    """What the second ranking, tried because the first choice's fix left outliers, gave."""
    what = (
        "the choice from it is clean and is the one given"
        if widened
        else "its choice is not clean either, so the first choice is given"
    )
    return (
        "the first choice's fix left outliers, so discovery ranked the best "
        f"{BLOCK_K} units of each searched block from block {detection.first_written} as well; "
        + what
    )


def _causal_selection(
    model: Model,
    held: torch.Tensor,
    ranking: NeuronSet,
    detection: DetectionRecord,
    batch_size: int,
    progress: Progress,
) -> Causal:
    """The causal check on ``held``: the ranked units whose zeroing removes the outliers."""
    with (
        progress(
            None, "causal check: zeroing candidates on held-out images (rounds of candidates)"
        ) as update,
        distributed.local(),
    ):
        selection = causal_set(model, held, ranking, detection, batch_size, progress=update)
    if selection.baseline.n_outlier_patches == 0:
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
    ranking: NeuronSet, selection: Causal | None, search: NeuronSearch
) -> tuple[NeuronSet, tuple[int, ...]]:
    """The candidates in the order calibration takes them, and the values of k to check: a
    fixed top-k's ranking whole, the causal set whole and without its siblings (the curve over
    k only if both fail), or the ranking over :data:`DEFAULT_KS`."""
    if search.top_k != "auto":
        order, ks = ranking, (0, len(ranking))
    elif selection is not None:
        order = _ordered(ranking, selection.units())
        ks = (0, len(order) - siblings_in(selection), len(order))  # with and without siblings
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
    unfixed: FixCheck,
) -> tuple[NeuronSet, TopKCurve]:
    """The fix checked on ``held`` at each of ``ks`` (k = 0: ``unfixed``); a causal set
    (``keep_all``) whose fix leaves artifacts is checked at every k of :data:`DEFAULT_KS`
    instead."""
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
            unfixed=unfixed,
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
                unfixed=unfixed,
            )
    return chosen, curve


def _held_out(held: torch.Tensor, chosen: NeuronSet, before: FixCheck, after: FixCheck) -> HeldOut:
    """The held-out images with no fix (k = 0) and with the chosen one."""
    return HeldOut(
        n_images=len(held),
        k=len(chosen),
        outlier_rate_before=before.outlier_rate,
        max_patch_norm_before=before.max_norm,
        median_patch_norm_before=before.median_norm,
        max_over_median_before=before.max_over_median,
        blocks_with_outlier_mode_before=before.blocks_with_mode,
        outlier_rate_after=after.outlier_rate,
        max_patch_norm_after=after.max_norm,
        median_patch_norm_after=after.median_norm,
        max_over_median_after=after.max_over_median,
        blocks_with_outlier_mode_after=after.blocks_with_mode,
        ordinary_max_over_median=before.ordinary_max_over_median,
    )


def _half_sets(
    model: Model,
    disc: HeldOutSplit,
    held: torch.Tensor,
    detection: DetectionRecord,
    selection: Causal,
    search: NeuronSearch,
    batch_size: int,
    progress: Progress,
) -> Stability:
    """The stability check: the causal set of each half of the discovery images."""
    from vitreg.neurons.stability import half_sets

    with (
        progress(2, "stability: the causal set of each half of the images"),
        distributed.local(),
    ):
        return half_sets(
            model, disc, held, detection, selection.units(), search, batch_size=batch_size
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
) -> OtherSizes:
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
