"""Causal selection of register neurons: keep the units that *create* the outliers.

Algorithm 1 of Jiang et al. ranks units by their activation on outlier tokens, which ranks units
that *read* an existing outlier (and fire because of it) as high as the units that write it. Here
each candidate is judged by what zeroing it does to the outliers on held-out images, at every
block from the emergence block to the detection layer:

- **excess** at a block: for the base run's outlier patches ``O`` (at the detection layer), the
  mean over ``O`` of ``log(norm / m)`` (``m``: that block's base median patch norm), minus the
  same mean over the ordinary patches -- about 0 when the outlier patches look like ordinary
  ones. Fractions are of the base excess at the detection layer, so every block is on one scale;
- **greedy forward selection**: at each step, one forward and backward pass with the current set
  zeroed measures the excess exactly and estimates, through a gate on every candidate unit, how
  much zeroing each remaining one would remove (``activation x gradient``); the best ones are
  added. When no estimate reaches ``min_gain`` while outliers are left at some block, growing
  groups of the best-estimated units are measured exactly instead (units that only matter
  together, or whose write acts through later units, are under-read by the estimate); the
  selection stops when the excess is gone at every block or no group removes more;
- **completion**: a set that cleans the outliers can leave out units that write them too (weak
  writers that compensate for each other). The remaining candidates of the writing blocks are
  zeroed together with the set active; when that removes excess, each one whose absence from
  the group costs a real share of it joins, and pruning judges the whole set again;
- **pruning**: each chosen unit is measured exactly, zeroed alone (the others active) and
  restored alone (the others zeroed). A unit whose zeroing removes far more than its own
  direct write acts through other units (a feature detector upstream of the writers), unless it
  also lowers the excess at its own block's output by a real share of that: a weak early writer
  whose write later blocks build on. A unit after the emergence block whose activation on the
  outlier patches falls below :data:`READER_PERSISTENCE` of its base level once the others are
  zeroed fires *because* the patches are outliers: a reader that reinforces them, dropped. At or
  before the emergence block the same holds below :data:`READER_FLOOR` when its input already
  carries :data:`EXISTING` of the block's excess (the survey placed the emergence late: its
  presence test sees a mode blocks after the excess has grown); at it, with less of it there,
  the units whose activation falls below that floor are readers when zeroing them together (the
  rest active) moves less than :data:`QUIET_SHARE` of the excess (an amplifier there carries the
  block's growth); elsewhere before it no outlier exists at a unit's input, so none is a
  reader. Units that move the excess at no block alone are kept only if restoring
  them together brings excess back, and then those whose absence from that group (measured
  exactly) costs a real share of it; the rest are bystanders, dropped;
- **amplifiers**: a set that still leaves outliers takes back the units set aside as readers
  whose activation did not vanish (at least :data:`READER_FLOOR`): they also read a feature of
  those tokens, so they write the outliers where the others leave off (an amplifier after the
  emergence block), and are held readers again only when both their mean and their peak
  activation on the outlier patches fall below the floor (one that keeps firing hard on a few
  of them keeps those patches outliers, which a mean over all of them hides). Pruning judges
  the whole set again;
- **writes** (:mod:`~vitreg.neurons.writes`): a kept unit whose write points across its block's
  outlier direction (far less along it than the block's best-aligned kept unit) writes something
  else, shaving their norm at second order: dropped. Compensating writers share one write, so the
  set the fix needs can leave some of them out: the candidates of a kept unit's block that write
  what it writes, fire on the outlier patches and keep firing with the set zeroed (its
  **siblings**) join last.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vitreg.analysis.rules import image_mask
from vitreg.core.renamed import renamed
from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import HookContext
from vitreg.models.model import Model, iter_batches
from vitreg.models.replay import PrefixReplay
from vitreg.neurons.writes import (
    SIBLING_COS,
    off_direction,
    outlier_directions,
    sibling_matches,
    unit_writes,
)
from vitreg.progress import Update
from vitreg.results.neurons import (
    Causal,
    CausalBaseline,
    DetectionRecord,
    SelectionStep,
    UnitEffect,
)

Unit = tuple[int, int]
READER_PERSISTENCE = 0.3  # a unit after the emergence block below this share of its base
# activation on the outliers, with the rest of the set zeroed, fires because the patches are
# outliers: a reader, set aside while the rest of the search can do without it
READER_FLOOR = 0.03  # one below this share fires only because they are outliers: a reader for
# good. One between the two that the search cannot do without (the set leaves outliers) also
# reads a feature of those tokens: an amplifier, a writer
EXISTING = 0.25  # share of a block's outlier excess already at its input: the outlier exists
# there (the survey placed the emergence late), so units of that block can be readers
QUIET_SHARE = 0.1  # below it, at the emergence block with less than EXISTING at its input, the
# units whose activation vanishes with the rest zeroed are readers: zeroing them together, the
# rest active, moves less than this share of the excess (an amplifier there carries the growth)
MEDIATED = 50  # zeroing a unit removes > this x its own direct write: it acts through others
OWN_SHARE = 0.1  # ... unless it removes >= this share of that effect at its own block's output:
# then it writes the outliers itself (a weak early writer that later blocks build on)
ESTIMATE_TRIES = 4  # tiers of estimated units tried, when one over-reads, before exact groups
MAX_ROUNDS = 3  # selection rounds: readers and mediators dropped by pruning are excluded
WEAK_SHARE = 0.2  # a unit of a group that matters only together keeps >= this x its fair share
SIBLINGS = (
    f"siblings: the write of a chosen unit of their block (cosine >= {SIBLING_COS}), on the "
    "outlier patches, still firing with the set zeroed"
)


@dataclass
class Baseline:
    """The base run on the causal images: outlier patches, each block's median and ordinary
    level, and every candidate layer's mean |activation| on the outlier patches."""

    threshold: float | None
    medians: dict[int, float]
    ordinary: dict[int, float]
    n_outliers: int
    masks: list[torch.Tensor]  # per batch, [B, N] bool outlier patches (detection layer)
    acts: dict[int, torch.Tensor]
    sums: dict[int, torch.Tensor]  # ``acts`` before the division by the outlier count
    peaks: dict[int, torch.Tensor] = field(default_factory=dict)  # largest |activation| on them


@dataclass
class Measure:
    """One exact pass with a set zeroed: the excess per block, gate gradients, activations
    (each unit's mean |activation| on the outlier patches) and their peaks (its largest)."""

    excess: dict[int, float]
    grads: dict[int, torch.Tensor] | None
    acts: dict[int, torch.Tensor]
    peaks: dict[int, torch.Tensor]


class CausalProbe:
    """Exact excess per block (and gate gradients) of the model with a set of units zeroed."""

    def __init__(
        self,
        model: Model,
        images: torch.Tensor,
        detect_layer: int,
        rule: str,
        value: float | None,
        candidates: Sequence[Unit],
        batch_size: int = 16,
        first_layer: int | None = None,
    ) -> None:
        self.model = model
        self.images = images
        self.detect = detect_layer
        self.batch_size = batch_size
        self.layers = sorted({layer for layer, _ in candidates})
        first = detect_layer if first_layer is None else min(first_layer, detect_layer)
        self.blocks = list(range(first, detect_layer + 1))
        self.passes = 0
        self.state: dict[str, Any] = {}
        # passes that zero nothing before block k start from its recorded input (exact)
        self.replay = PrefixReplay(model, lambda: self.state["batch"])
        self.known: dict[frozenset[Unit], Measure] = {}  # every pass is exact: none twice
        self.base = self._baseline(rule, value)

    # one pass ---------------------------------------------------------------------------------
    def _run(
        self,
        zeroed: Sequence[Unit],
        grad: bool,
        block_fn: Callable[[int, int, torch.Tensor], Any],
        masks: list[torch.Tensor] | None,
        record: Sequence[int] = (),
    ) -> tuple[dict[int, torch.Tensor] | None, dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Forward every batch up to the detection layer with ``zeroed`` units gated to 0.

        ``block_fn(i, block, norms)`` sees batch ``i``'s ``[B, N]`` norms at each measured block
        and returns a scalar (the detection layer's is differentiated when ``grad``). Returns the
        gate gradients (when ``grad``) and each layer's summed and largest |activation| on
        ``masks``.
        Without gradients, the blocks before the first zeroed unit replay their recorded output
        (those of a layer before it are then the base run's, and ``block_fn`` does not see the
        blocks before the last replayed one); ``record``: the layers whose input this pass
        records for that.
        """
        model = self.model
        first = min((layer for layer, _ in zeroed), default=model.n_layers)
        start = 0 if grad else self.replay.start(min(first, self.detect))
        gates = {}
        for layer in self.layers:
            g = torch.ones(model.d_mlp, device=model.device, dtype=model.dtype)
            off = [u for lay, u in zeroed if lay == layer]  # zeroed units are candidates
            if off:
                g[off] = 0
            gates[layer] = g.requires_grad_(grad)
        grads = {layer: torch.zeros(model.d_mlp, dtype=torch.float64) for layer in self.layers}
        acts = {
            layer: self.base.sums[layer].clone()
            if layer < start
            else torch.zeros(model.d_mlp, dtype=torch.float64)
            for layer in self.layers
        }
        peaks = {
            layer: self.base.peaks[layer].clone()
            if layer < start
            else torch.zeros(model.d_mlp, dtype=torch.float64)
            for layer in self.layers
        }
        state = self.state

        def gate(layer: int):
            def fn(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
                if masks is not None:
                    m = masks[state["batch"]].to(t.device)
                    on = t.detach()[m].abs()
                    if on.shape[0]:
                        acts[layer] += on.sum(0).double().cpu()
                        peaks[layer] = torch.maximum(peaks[layer], on.amax(0).double().cpu())
                return t * gates[layer]

            return fn

        def detach(t: torch.Tensor, hook: HookContext) -> torch.Tensor:
            return t.detach()  # branch inputs: gradients take only the direct (residual) path

        def reach(block: int):
            def fn(t: torch.Tensor, hook: HookContext) -> None:
                if block < start - 1:
                    return  # a replayed block shows block ``start - 1``'s output, not its own
                value = block_fn(state["batch"], block, t.float().norm(dim=-1))
                if block == self.detect:
                    state["value"] = value

            return fn

        hooks = [(hook_name(lay, "mlp.hook_post"), gate(lay)) for lay in self.layers]
        if grad:
            for i in range(self.layers[0] + 1, self.detect + 1):
                hooks += [(hook_name(i, f"{ln}.hook_out"), detach) for ln in ("ln1", "ln2")]
        hooks += [(hook_name(b, "hook_resid_post"), reach(b)) for b in self.blocks]
        with (
            model.hooks(hooks),
            torch.set_grad_enabled(grad),
            self.replay.record(record),
            self.replay.replay(start),
        ):
            for i, batch in enumerate(iter_batches(self.images, self.batch_size)):
                state["batch"] = i
                # later blocks cannot change the detection layer's output: stop after it
                model.features(batch, stop_at_layer=self.detect + 1)
                if grad:
                    used = [gates[lay] for lay in self.layers]
                    got = torch.autograd.grad(state["value"], used, allow_unused=True)
                    for lay, g in zip(self.layers, got, strict=True):
                        if g is not None:
                            grads[lay] += g.detach().double().cpu()
        self.passes += 1
        return (grads if grad else None), acts, peaks

    def _baseline(self, rule: str, value: float | None) -> Baseline:
        """Outlier patches, medians and ordinary levels from one pass (recording each candidate
        layer's input for later passes); the activations on the outlier patches, which need
        those patches, and the gate gradients from a second."""
        norms: dict[int, list[torch.Tensor]] = {b: [] for b in self.blocks}
        inputs = [k for k in self.layers if k <= self.detect]  # blocks this pass reaches
        self._run([], False, lambda i, b, n: norms[b].append(n.detach().cpu()), None, inputs)
        lay = self.model.layout
        masks = []
        for n in norms[self.detect]:
            m = image_mask(n, rule, value)
            m[:, lay.prefix] = False  # patches only
            masks.append(m)
        outlier = torch.cat([m[:, lay.patches].flatten() for m in masks])
        medians, ordinary = {}, {}
        for b in self.blocks:
            flat = torch.cat([lay.take(n, "patches").flatten() for n in norms[b]])
            medians[b] = max(float(flat.median()), 1e-12)
            logs = (flat / medians[b]).log()
            ordinary[b] = float(logs[~outlier].mean()) if (~outlier).any() else 0.0
        n_out = int(outlier.sum())
        self.base = Baseline(value, medians, ordinary, n_out, masks, {}, {}, {})
        self.base.acts = self.measure([], grad=True).acts  # nothing zeroed: nothing replayed
        return self.base

    # the excess ------------------------------------------------------------------------------
    def falls(self, high: Measure, low: Measure) -> list[float]:
        """How much the excess falls at each measured block from ``high`` to ``low``."""
        return [high.excess[b] - low.excess[b] for b in self.blocks]

    def measure(self, zeroed: Sequence[Unit], grad: bool = False) -> Measure:
        """Excess of the base outlier patches over the ordinary level at every measured block
        with ``zeroed`` off, the gradient of the detection layer's wrt every gate (``grad``), and
        each unit's mean |activation| on the outlier patches. A set measured before is not run
        again (a pass with gradients also answers one without)."""
        key = frozenset(zeroed)
        known = self.known.get(key)
        if known is not None and (known.grads is not None or not grad):
            return known
        b = self.base
        totals: dict[int, list[torch.Tensor]] = {k: [] for k in self.blocks}

        def block_fn(i: int, block: int, norms: torch.Tensor) -> torch.Tensor:
            m = b.masks[i].to(norms.device)
            s = (norms[m] / b.medians[block]).log().sum() / max(b.n_outliers, 1)
            totals[block].append(s.detach())
            return s

        grads, acts, peaks = self._run(zeroed, grad, block_fn, b.masks)
        # a block the pass replayed is unchanged by it: its excess is the base run's
        excess = {
            k: float(sum(v)) - b.ordinary[k] if v else self.known[frozenset()].excess[k]
            for k, v in totals.items()
        }
        if not zeroed:
            b.sums, b.peaks = acts, peaks  # the base run's: a replayed pass starts from them
        n = max(b.n_outliers, 1)
        self.known[key] = Measure(excess, grads, {k: v / n for k, v in acts.items()}, peaks)
        return self.known[key]


def select_causal(
    model: Model,
    images: torch.Tensor,
    candidates: Sequence[Unit],
    detection: DetectionRecord,
    *,
    min_gain: float = 0.01,
    clean_at: float = 0.02,
    max_units: int = 64,
    batch_size: int = 16,
    progress: Update | None = None,
) -> Causal:
    """Greedy causal selection among ``candidates`` (ranked ``(layer, unit)`` pairs), with the
    layers and the outlier rule of ``detection`` (the survey's).

    The excess is measured at every block from ``detection.first_written`` (the first block that
    writes the outliers; ``None``: the detection layer only) to its detection layer;
    ``detection.emergence_layer`` (``None``: the first block measured) is the first block whose
    output shows them, after which units can be readers. Each step adds the remaining candidates
    whose estimated removal is at least half the best one's and at least ``min_gain`` of the
    base excess, or, when no estimate is that large, the smallest group of the best-estimated
    ones whose exact removal is. It stops when the excess left at every block is below
    ``clean_at`` of the base (the outlier patches look ordinary), when nothing removes
    ``min_gain`` more, or at ``max_units``. Estimates come from the direct (residual-stream)
    path of each unit's write, so a unit that only feeds other units (a feature detector
    upstream of the writers) is not taken for a writer by them; every measured excess is exact.
    Pruning then drops readers, units acting through others (zeroing them removes > ``MEDIATED``
    x their own write) and bystanders; when it drops a reader or such a unit, selection resumes
    from what is kept without them (at most ``MAX_ROUNDS`` rounds), so a writer they stood in
    for is still found.
    """
    detect = detection.detect_layer
    probe = CausalProbe(
        model,
        images,
        detect,
        detection.threshold,
        detection.threshold_value,
        candidates,
        batch_size,
        detection.first_written,
    )
    base = probe.measure([], grad=True)
    scale = base.excess[detect]
    selection = _started(probe, base, detection, len(candidates), int(images.shape[0]))
    if probe.base.n_outliers == 0 or scale <= 0:
        selection.passes = probe.passes
        return selection
    first = _estimates(base.grads, candidates)
    greedy = _Greedy(probe, candidates, scale, min_gain, clean_at, max_units)
    kept, effects, final = greedy.rounds(base, first, selection, progress)
    kept, effects, final = greedy.complete(kept, effects, final, base, first, selection)
    kept, effects, final = greedy.amplifiers(kept, effects, final, base, first, selection)
    kept, effects, final = greedy.by_writes(kept, effects, final, selection)
    for u in kept:
        effects[u]["estimated"] = first.get(u, 0.0) / scale
    selection.chosen = [list(u) for u in kept]
    selection.effects = [UnitEffect(layer=u[0], unit=u[1], **effects[u]) for u in kept]
    selection.residual_fraction = final.excess[detect] / scale
    selection.residual_by_block = {str(b): v / scale for b, v in final.excess.items()}
    selection.passes = probe.passes
    return selection


def siblings_in(selection: Causal) -> int:
    """How many of ``selection``'s chosen units joined as siblings (the last ones)."""
    return sum(len(s.added) for s in selection.steps if s.by == SIBLINGS)


def _started(
    probe: CausalProbe, base: Measure, detection: DetectionRecord, n_candidates: int, n_images: int
) -> Causal:
    """The selection before its first step: the base run's outlier patches and excess."""
    detect = detection.detect_layer
    return Causal(
        method="greedy forward selection on the outlier excess at every block from "
        "emergence to the detection layer (gradient-estimated marginals, exact passes, exact "
        "groups when the estimates under-read), then drop-one pruning with a reader test",
        detect_layer=detect,
        first_layer=probe.blocks[0],
        emergence_layer=(
            probe.blocks[0] if detection.emergence_layer is None else detection.emergence_layer
        ),
        n_candidates=n_candidates,
        n_images=n_images,
        passes=0,
        baseline=CausalBaseline(
            threshold=detection.threshold,
            threshold_value=detection.threshold_value,
            median_patch_norm=probe.base.medians[detect],
            n_outlier_patches=probe.base.n_outliers,
            ordinary_excess=probe.base.ordinary[detect],
            excess=base.excess[detect],
            excess_by_block={str(b): v for b, v in base.excess.items()},
        ),
        residual_fraction=1.0,
        residual_by_block={},
        chosen=[],
        effects=[],
        steps=[],
        dropped=[],
    )


@dataclass
class _Greedy:
    """The greedy forward selection: the probe, the candidates, the base excess at the
    detection layer (``scale``) and the rules that stop it."""

    probe: CausalProbe
    candidates: Sequence[Unit]
    scale: float
    min_gain: float
    clean_at: float
    max_units: int
    taken: frozenset[Unit] = frozenset()  # readers taken back as amplifiers

    def left(self, m: Measure) -> float:
        """The excess left at the worst block, on the detection layer's scale."""
        return max(m.excess.values()) / self.scale

    def gain(self, before: Measure, after: Measure) -> float:
        """The largest fall of the excess at a block; none when another block rises as much."""
        change = self.probe.falls(before, after)
        return max(change) / self.scale if min(change) > -self.min_gain * self.scale else -1.0

    def rounds(
        self,
        base: Measure,
        direct: dict[Unit, float],
        selection: Causal,
        progress: Update | None,
    ) -> tuple[list[Unit], dict[Unit, dict[str, float]], Measure]:
        """Grow and prune, again from what is kept while pruning drops a reader or a mediator
        (at most ``MAX_ROUNDS`` rounds): the kept units, their effects and their measure."""
        excluded: set[Unit] = set()  # readers and mediators found by pruning: never chosen again
        kept: list[Unit] = []
        effects: dict[Unit, dict[str, float]] = {}
        m = base
        for _ in range(MAX_ROUNDS):
            chosen, m = self.grow(list(kept), m, excluded, selection, progress)
            n_dropped = len(selection.dropped)
            kept, effects = self.prune(chosen, m, base, direct, selection)
            new = selection.dropped[n_dropped:]
            excluded |= {(d.layer, d.unit) for d in new if d.kind != "bystander"}
            if kept != chosen:
                m = self.probe.measure(kept, grad=True)
            if all(d.kind == "bystander" for d in new):
                break  # nothing took a writer's place: the selection stands
        return kept, effects, m

    def complete(
        self,
        kept: list[Unit],
        effects: dict[Unit, dict[str, float]],
        final: Measure,
        base: Measure,
        direct: dict[Unit, float],
        selection: Causal,
    ) -> tuple[list[Unit], dict[Unit, dict[str, float]], Measure]:
        """Writers the selection stopped short of: a set that cleans the outliers can leave out
        units that write them too (writers that compensate for each other). The remaining
        candidates of the writing blocks are zeroed together with the set active; when that
        removes excess, each one whose absence from the group costs a real share of it joins,
        and pruning judges the whole set again."""
        dropped = {(d.layer, d.unit) for d in selection.dropped if d.kind != "bystander"}
        room = self.max_units - len(kept)
        group = [
            u
            for u in self.candidates
            if self.probe.blocks[0] <= u[0] <= self.probe.detect
            and u not in kept
            and u not in dropped
        ][: max(room, 0)]
        if len(group) < 1:
            return kept, effects, final
        zeroed = self.probe.measure(group)
        together = max(self.probe.falls(base, zeroed)) / self.scale
        if together < self.min_gain * math.log2(max(len(group), 2)):
            return kept, effects, final
        share = WEAK_SHARE * together / len(group)
        added = [
            u
            for u in group
            if max(self.probe.falls(self.probe.measure([v for v in group if v != u]), zeroed))
            / self.scale
            >= share
        ]
        if not added:
            return kept, effects, final
        chosen = kept + added
        m = self.probe.measure(chosen, grad=True)
        self.record(selection, added, "exact group, with the set active", m)
        return self.settle(chosen, m, base, direct, selection)

    def record(self, selection: Causal, added: list[Unit], by: str, m: Measure) -> None:
        """Add to ``selection``'s steps the units ``added`` (found ``by``) and what the set with
        them zeroed (``m``) leaves."""
        selection.steps.append(
            SelectionStep(
                added=[list(u) for u in added],
                by=by,
                residual_fraction=m.excess[self.probe.detect] / self.scale,
                worst_block_fraction=self.left(m),
            )
        )

    def settle(
        self,
        chosen: list[Unit],
        m: Measure,
        base: Measure,
        direct: dict[Unit, float],
        selection: Causal,
    ) -> tuple[list[Unit], dict[Unit, dict[str, float]], Measure]:
        """Prune ``chosen`` (measured ``m``) again and measure what is kept."""
        kept, effects = self.prune(chosen, m, base, direct, selection)
        return kept, effects, self.probe.measure(kept, grad=True)

    def prune(
        self,
        chosen: list[Unit],
        final: Measure,
        base: Measure,
        direct: dict[Unit, float],
        selection: Causal,
    ) -> tuple[list[Unit], dict[Unit, dict[str, float]]]:
        """:func:`_prune` with this selection's scale, gain floor, emergence block and the
        amplifiers taken back; the units it drops go to ``selection.dropped``."""
        return _prune(
            self.probe,
            chosen,
            final,
            base,
            direct,
            self.scale,
            self.min_gain,
            selection.emergence_layer,
            selection.dropped,
            self.taken,
        )

    def amplifiers(
        self,
        kept: list[Unit],
        effects: dict[Unit, dict[str, float]],
        final: Measure,
        base: Measure,
        direct: dict[Unit, float],
        selection: Causal,
    ) -> tuple[list[Unit], dict[Unit, dict[str, float]], Measure]:
        """Readers the set cannot do without: when the kept set leaves outliers, the units set
        aside as readers whose activation did not vanish with the rest zeroed (they also read a
        feature of those tokens) are taken back when zeroing them removes excess, and pruning
        judges the whole set again, holding them readers only below :data:`READER_FLOOR`."""
        if self.left(final) <= self.clean_at:
            return kept, effects, final
        back = [
            (d.layer, d.unit)
            for d in selection.dropped
            if d.kind == "reader" and (d.persistence or 0.0) >= READER_FLOOR
        ]
        back = [u for u in dict.fromkeys(back) if u not in kept][: self.max_units - len(kept)]
        if not back:
            return kept, effects, final
        m = self.probe.measure(kept + back, grad=True)
        if self.gain(final, m) < self.min_gain:
            return kept, effects, final
        taken = set(back)
        selection.dropped = [d for d in selection.dropped if (d.layer, d.unit) not in taken]
        self.record(selection, back, "amplifiers: readers the set cannot do without", m)
        self.taken = frozenset(back)
        return self.settle(kept + back, m, base, direct, selection)

    def by_writes(
        self,
        kept: list[Unit],
        effects: dict[Unit, dict[str, float]],
        final: Measure,
        selection: Causal,
    ) -> tuple[list[Unit], dict[Unit, dict[str, float]], Measure]:
        """The rules read from what units write (:mod:`~vitreg.neurons.writes`): kept units
        that write something else than their block's outliers are dropped; then the candidates
        of the kept units' blocks that write what one of them writes, on the same patches, and
        keep firing once the set and they are zeroed join, last (the set without them stays a
        prefix)."""
        if not kept:
            return kept, effects, final
        probe = self.probe
        blocks = {u[0] for u in kept}
        rest = [u for u in self.candidates if u not in kept and u[0] in blocks]
        writes = unit_writes(probe.model, kept + rest, probe.images)
        directions = outlier_directions(
            probe.model, probe.images, probe.base.masks, sorted(blocks), probe.batch_size
        )
        off = off_direction(kept, writes, directions)
        for u, (cos, best) in off.items():
            selection.dropped.append(
                UnitEffect(
                    layer=u[0],
                    unit=u[1],
                    **effects.pop(u),
                    kind="off-direction",
                    reason=f"writes something else than the outliers: its write's cosine with "
                    f"the outlier patches' direction at block {u[0]} is {cos:.2f}, against "
                    f"{best:.2f} for the block's best-aligned unit (a write across the outliers "
                    "raises their norm only at second order)",
                )
            )
        kept = [u for u in kept if u not in off]
        m = probe.measure(kept) if off else final
        found = sibling_matches(kept, rest, writes, probe.base.acts)
        if not found:
            return kept, effects, m
        both = probe.measure(kept + list(found))
        joined = []
        for u, (c, _) in found.items():
            mine, theirs = (
                _share(both.acts, probe.base.acts, u),
                _share(both.acts, probe.base.acts, c),
            )
            if mine >= max(READER_FLOOR, 0.5 * theirs):
                joined.append(u)
                effects[u] = {"persistence": mine}
        if not joined:
            return kept, effects, m
        if len(joined) < len(found):
            both = probe.measure(kept + joined)
        taken = set(joined)
        selection.dropped = [d for d in selection.dropped if (d.layer, d.unit) not in taken]
        self.record(selection, joined, SIBLINGS, both)
        return kept + joined, effects, both

    def grow(
        self,
        chosen: list[Unit],
        m: Measure,
        excluded: set[Unit],
        selection: Causal,
        progress: Update | None,
    ) -> tuple[list[Unit], Measure]:
        """Add units step by step while excess is left at some block and there is room."""
        while len(chosen) < self.max_units and self.left(m) > self.clean_at:
            step = self.step(chosen, m, excluded)
            if step is None:
                break
            added, m, how = step
            chosen += added
            self.record(selection, added, how, m)
            if progress is not None:
                progress(len(selection.steps))
        return chosen, m

    def step(
        self, chosen: list[Unit], m: Measure, excluded: set[Unit]
    ) -> tuple[list[Unit], Measure, str] | None:
        """The units one step adds, the measure with them zeroed and how they were found;
        ``None`` when no candidate is left or no group removes more."""
        estimates = _estimates(m.grads, self.candidates)
        rest = sorted(
            (
                (est, u)
                for u, est in estimates.items()
                if est > 0 and u not in excluded and u not in chosen
            ),
            reverse=True,
        )
        if not rest:
            return None
        room = self.max_units - len(chosen)
        # units set aside below may still matter together: the group step ranks them all
        ranked = [u for _, u in rest][:room]
        tier = self.estimated(chosen, m, rest, room)
        if tier is not None:
            return *tier, "estimated"
        added, after = _group_step(self.probe, chosen, ranked, m, self.gain, self.min_gain)
        return (added, after, "exact group") if added else None

    def estimated(
        self, chosen: list[Unit], m: Measure, rest: list[tuple[float, Unit]], room: int
    ) -> tuple[list[Unit], Measure] | None:
        """The first tier of best-estimated units whose exact removal gains ``min_gain``, and
        its measure; ``None`` when the estimates are too small or over-read every tier tried."""
        for _ in range(ESTIMATE_TRIES):
            if not rest or rest[0][0] < self.min_gain * self.scale:
                return None
            floor = max(0.5 * rest[0][0], self.min_gain * self.scale)
            tier = [u for est, u in rest if est >= floor][:room]
            after = self.probe.measure(chosen + tier, grad=True)
            if self.gain(m, after) < self.min_gain and len(tier) > 1:  # one may spoil the tier
                tier = tier[:1]
                after = self.probe.measure(chosen + tier, grad=True)
            if self.gain(m, after) >= self.min_gain:
                return tier, after
            # the estimate over-read the best unit: set it aside, try the next ones
            rest = [(est, u) for est, u in rest if u not in tier]
        return None


def _estimates(
    grads: dict[int, torch.Tensor] | None, candidates: Sequence[Unit]
) -> dict[Unit, float]:
    """Estimated excess removed by zeroing each candidate: the gradient wrt its gate."""
    assert grads is not None
    return {(lay, u): float(grads[lay][u]) for lay, u in candidates}


def _share(now: dict[int, torch.Tensor], before: dict[int, torch.Tensor], u: Unit) -> float:
    """Unit ``u``'s value in ``now`` as a share of its value in ``before`` (0 where that is 0)."""
    was = float(before[u[0]][u[1]])
    return float(now[u[0]][u[1]]) / was if was > 0 else 0.0


def _group_step(
    probe: CausalProbe,
    chosen: list[Unit],
    ranked: list[Unit],
    current: Measure,
    gain: Callable[[Measure, Measure], float],
    min_gain: float,
) -> tuple[list[Unit], Measure]:
    """The smallest group of the best-ranked units of the writing blocks (2, 4, 8, ... of them),
    else one block's ranked units, whose exact removal gains ``min_gain x log2(group size)`` at
    some block (and raises it at none); ``([], current)`` when none does."""
    # units that only matter together write, so they sit where the excess grows: a unit of an
    # earlier block feeds the writers (a flag detector) and would spoil every group it joins
    ranked = [u for u in ranked if u[0] >= probe.blocks[0]]
    if not ranked:
        return [], current
    tried = []
    size = 2
    while True:
        tried.append(ranked[:size])
        if size >= len(ranked):
            break
        size *= 2
    # one unit whose zeroing raises the excess somewhere (a flag detector upstream) spoils every
    # prefix: then each block's ranked units are tried as one group, in the order of its best unit
    layers = list(dict.fromkeys(layer for layer, _ in ranked))
    tried += [g for lay in layers if (g := [u for u in ranked if u[0] == lay]) not in tried]
    for group in tried:
        after = probe.measure(chosen + group, grad=True)
        # a bigger group must remove more: a few bystanders also shave noise off the excess
        if gain(current, after) >= min_gain * math.log2(max(len(group), 2)):
            return group, after
    return [], current


def _prune(
    probe: CausalProbe,
    chosen: list[Unit],
    final: Measure,
    base: Measure,
    direct: dict[Unit, float],
    scale: float,
    min_gain: float,
    emergence: int,
    dropped: list[UnitEffect],
    amplifiers: frozenset[Unit] = frozenset(),
) -> tuple[list[Unit], dict[Unit, dict[str, float]]]:
    """Measure each chosen unit exactly, zeroed alone and restored alone (the others zeroed).

    Mediators (zeroing them alone removes far more than their own write) and readers
    (activation on the outliers gone once the others are zeroed) are dropped. Units that
    change the excess neither way alone are kept when restoring them together brings excess back
    and their own estimated write is a real share of it; otherwise they are bystanders.
    """
    pruning = _Pruning(probe, base, direct, scale, min_gain, emergence, dropped, amplifiers)
    pruning.mediators(chosen)
    # the rest measured without the mediators: zeroing those silences the writers they feed
    rest = [u for u in chosen if u in pruning.effects]
    if len(rest) < len(chosen):
        final = probe.measure(rest)
    pruning.in_set(rest, final)
    pruning.readers(rest)
    pruning.quiet(rest)
    pruning.bystanders(chosen, final)
    return [u for u in chosen if u in pruning.effects], pruning.effects


@dataclass
class _Pruning:
    """Pruning's measures of the chosen units, against the base run: each unit's effects, and
    the units dropped (into ``dropped``) with their kind and the reason."""

    probe: CausalProbe
    base: Measure
    direct: dict[Unit, float]  # each unit's estimated direct write
    scale: float
    min_gain: float
    emergence: int
    dropped: list[UnitEffect]
    amplifiers: frozenset[Unit] = frozenset()  # units taken back: readers only below the floor
    effects: dict[Unit, dict[str, float]] = field(default_factory=dict)
    peaks: dict[Unit, float] = field(default_factory=dict)  # peak activation's persistence

    def drop(self, u: Unit, kind: str, reason: str) -> None:
        """Move ``u`` from the effects to the dropped units, saying why."""
        self.dropped.append(
            UnitEffect(layer=u[0], unit=u[1], **self.effects.pop(u), kind=kind, reason=reason)
        )

    def most(self, high: Measure, low: Measure) -> float:
        """The largest fall of the excess at any measured block, from ``high`` to ``low``."""
        return max(self.probe.falls(high, low)) / self.scale

    def mediators(self, chosen: list[Unit]) -> None:
        """Each unit zeroed alone; those acting through other units are dropped."""
        detect, first, base = self.probe.detect, self.emergence, self.base
        for u in chosen:
            alone = self.probe.measure([u])
            self.effects[u] = {
                "alone": (base.excess[detect] - alone.excess[detect]) / self.scale,
                "alone_at_emergence": (base.excess[first] - alone.excess[first]) / self.scale,
                "alone_most": self.most(base, alone),
            }
            own = self.direct.get(u, 0.0) / self.scale
            effect = self.effects[u]["alone"]
            if (
                effect >= self.min_gain
                and effect > MEDIATED * max(own, 0.0)
                and self.at_own_block(u, alone) < OWN_SHARE * effect
            ):
                self.drop(
                    u,
                    "mediator",
                    f"acts through other units: zeroing it alone removes {effect:.1%} "
                    f"of the excess while its own write on the outlier patches accounts for "
                    f"{own:.3%} (a feature detector upstream of the writers, not a writer)",
                )

    def at_own_block(self, u: Unit, alone: Measure) -> float:
        """How much zeroing ``u`` alone lowers the excess at its own block's output (0 when
        that block is not measured)."""
        if u[0] not in self.base.excess:
            return 0.0
        return (self.base.excess[u[0]] - alone.excess[u[0]]) / self.scale

    def in_set(self, rest: list[Unit], final: Measure) -> None:
        """Each unit of ``rest`` restored alone (the others zeroed), its persistence (its mean
        |activation| on the outlier patches as a share of the base run's) and its peak's share
        (its largest, kept for the amplifiers' reader test)."""
        detect, first = self.probe.detect, self.emergence
        for u in rest:
            others = self.probe.measure([v for v in rest if v != u])
            self.effects[u] |= {
                "in_set": (others.excess[detect] - final.excess[detect]) / self.scale,
                "in_set_at_emergence": (others.excess[first] - final.excess[first]) / self.scale,
                "in_set_most": self.most(others, final),
                "persistence": _share(others.acts, self.probe.base.acts, u),
            }
            self.peaks[u] = _share(others.peaks, self.probe.base.peaks, u)

    def readers(self, rest: list[Unit]) -> None:
        """Drop the units of ``rest`` whose activation falls below their block's reader floor;
        an amplifier's is its mean or its peak, whichever keeps more (one that keeps firing hard
        on a few outlier patches writes the outliers left there)."""
        for u in rest:
            p = self.effects[u]["persistence"]
            if u in self.amplifiers:
                p = max(p, self.peaks[u])
            if p < self.reader_floor(u):
                self.drop(
                    u,
                    "reader",
                    f"a reader: with the rest of the set zeroed its activation on the outlier "
                    f"patches falls to {p:.0%} of its base level, so it fires because they are "
                    "outliers and reinforces outliers that other units create",
                )

    def quiet(self, rest: list[Unit]) -> None:
        """At the emergence block, the units whose activation vanishes with the rest zeroed
        (below :data:`READER_FLOOR`) though their input carries some excess, less than
        :data:`EXISTING` of it: readers when zeroing them together (the rest active) moves
        less than :data:`QUIET_SHARE` of the excess at every block."""
        quiet = [
            u
            for u in rest
            if u in self.effects
            and u not in self.amplifiers
            and u[0] == self.emergence
            and self.effects[u]["persistence"] < READER_FLOOR
            and self.base.excess.get(u[0] - 1, 0.0) > 0
        ]
        if not quiet:
            return
        # one unit alone was measured by the mediator test: the probe answers from that pass
        together = self.most(self.base, self.probe.measure(quiet))
        if together >= QUIET_SHARE:
            return
        for u in quiet:
            self.drop(
                u,
                "reader",
                f"a reader: with the rest of the set zeroed its activation on the outlier "
                f"patches falls to {self.effects[u]['persistence']:.0%} of its base level, so it "
                f"fires because they are outliers (its input carries some of the excess), and "
                f"zeroing the {len(quiet)} such unit(s) of its block moves only {together:.1%} "
                "of the excess",
            )

    def reader_floor(self, u: Unit) -> float:
        """The persistence below which ``u`` is a reader: after the emergence block
        :data:`READER_PERSISTENCE` (:data:`READER_FLOOR` for a unit taken back as an
        amplifier); at or before it :data:`READER_FLOOR` when its input already carries
        :data:`EXISTING` of its block's excess (the outlier exists there); 0 (none) otherwise,
        where no outlier exists yet."""
        layer = u[0]
        if layer > self.emergence:
            return READER_FLOOR if u in self.amplifiers else READER_PERSISTENCE
        prior = self.base.excess.get(layer - 1)
        at = self.base.excess.get(layer, 0.0)
        existing = prior is not None and prior >= EXISTING * at > 0
        return READER_FLOOR if existing else 0.0

    def strong(self, e: dict[str, float]) -> bool:
        """Zeroing it alone, or restoring it alone, moves the excess at some block: weak units
        write before the emergence block, where their whole effect may sit."""
        return max(e["alone_most"], e["in_set_most"]) >= self.min_gain

    def bystanders(self, chosen: list[Unit], final: Measure) -> None:
        """Drop the weak units (no effect alone either way) that restoring together with the
        other weak ones shows to bring back no real share of the excess."""
        effects, min_gain = self.effects, self.min_gain
        weak = [u for u in chosen if u in effects and not self.strong(effects[u])]
        if not weak:
            return
        kept = [v for v in chosen if v in effects and v not in weak]
        restored = self.probe.measure(kept)
        together = self.most(restored, final)
        share = WEAK_SHARE * together / len(weak)
        for u in weak:
            # exact: what the group loses without it (removing the last of an outlier counts
            # most in log terms, so one unit of a group that matters together may move little
            # alone or restored alone, and a lot here)
            own = (
                self.most(restored, self.probe.measure(kept + [u])) if together >= min_gain else 0.0
            )
            effects[u]["in_group"] = own
            if together < min_gain or own < share:
                self.drop(
                    u,
                    "bystander",
                    "a bystander: zeroing it alone removes no outlier excess, restoring it "
                    "alone brings none back"
                    + (
                        ", and restoring it with the other such units brings none back"
                        if together < min_gain
                        else f", and the excess those units bring back together "
                        f"({together:.2%} for {len(weak)} units) falls by only {own:.2%} "
                        "without it"
                    ),
                )


__getattr__ = renamed(__name__, {"CausalSelection": "Causal"}, globals())
