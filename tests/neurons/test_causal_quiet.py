"""Pruning at the emergence block when its input already carries a little of the excess: a unit
that fires only because the patches are outliers is a reader when zeroing it moves almost no
excess, and an amplifier (kept) when it carries the block's growth. Before the survey's
emergence block a unit that goes quiet is a reader only where its input already carries a real
share of its block's excess (the survey placed the emergence late)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vitreg.neurons.causal import Measure, _prune

BLOCKS = [5, 6, 7, 9]
BASE = {5: 0.05, 6: 0.37, 7: 1.87, 9: 1.06}  # a fifth of block 7's excess at its input


@dataclass
class _Base:
    acts: dict[int, torch.Tensor]
    peaks: dict[int, torch.Tensor]


class _AdditiveProbe:
    """Each unit removes a fixed excess from each block; ``needs`` units go quiet (activation
    0) once every unit they read is zeroed."""

    def __init__(self, removes: dict, needs: dict, base: dict | None = None) -> None:
        self.blocks, self.detect = BLOCKS, 9
        self.removes, self.needs = removes, needs
        self.levels = BASE if base is None else base
        ones = {b: torch.ones(8) for b in BLOCKS}
        self.base = _Base(acts=ones, peaks=ones)
        self.passes = 0

    def falls(self, high: Measure, low: Measure) -> list[float]:
        return [high.excess[b] - low.excess[b] for b in self.blocks]

    def measure(self, zeroed: Sequence, grad: bool = False) -> Measure:
        self.passes += 1
        off = set(zeroed)
        excess = {b: self.levels[b] - sum(self.removes[u].get(b, 0.0) for u in off) for b in BLOCKS}
        acts = {b: torch.ones(8) for b in BLOCKS}
        for u, reads in self.needs.items():
            if reads <= off:
                acts[u[0]][u[1]] = 0.0
        return Measure(excess, None, acts, acts)


def _run(removes: dict, needs: dict, base: dict | None = None) -> tuple[list, list]:
    probe = _AdditiveProbe(removes, needs, base)
    chosen = list(removes)
    dropped: list = []
    final = probe.measure(chosen)
    direct = {u: max(r.values()) for u, r in removes.items()}
    kept, _ = _prune(probe, chosen, final, probe.measure([]), direct, 1.0, 0.01, 7, dropped)
    return kept, dropped


WRITERS = {(6, 0): {6: 0.3, 7: 0.3, 9: 0.2}, (7, 1): {7: 1.4, 9: 0.8}}


def test_a_unit_that_goes_quiet_and_moves_little_is_a_reader() -> None:
    reader = {(7, 2): {7: 0.02, 9: 0.01}}
    kept, dropped = _run(WRITERS | reader, {(7, 2): {(6, 0)}})
    assert (7, 2) not in kept and set(kept) == set(WRITERS)
    assert [(d.layer, d.unit, d.kind) for d in dropped] == [(7, 2, "reader")]


def test_an_amplifier_that_carries_the_growth_is_kept() -> None:
    amplifier = {(7, 2): {7: 0.5, 9: 0.3}}
    kept, dropped = _run(WRITERS | amplifier, {(7, 2): {(6, 0)}})
    assert set(kept) == set(WRITERS) | {(7, 2)} and not dropped


def test_quiet_units_are_judged_together() -> None:
    """Three amplifiers that each move under the share alone, but a real share together."""
    group = {(7, k): {7: 0.06, 9: 0.04} for k in (2, 3, 4)}
    kept, dropped = _run(WRITERS | group, {u: {(6, 0)} for u in group})
    assert set(group) <= set(kept), dropped


EARLY = {(5, 0): {5: 0.8, 6: 0.8, 7: 1.0, 9: 0.6}, (7, 1): {7: 0.8, 9: 0.4}}


def test_a_quiet_unit_before_a_late_placed_emergence_block_is_a_reader() -> None:
    """The survey says block 7, but block 6's input carries 80% of its excess: a block-6 unit
    that goes quiet once the block-5 writer is zeroed reads the outlier."""
    reader = {(6, 2): {6: 0.05, 7: 0.05, 9: 0.03}}
    late = {5: 0.8, 6: 1.0, 7: 1.87, 9: 1.06}
    kept, dropped = _run(EARLY | reader, {(6, 2): {(5, 0)}}, late)
    assert set(kept) == set(EARLY), dropped
    assert [(d.layer, d.unit, d.kind) for d in dropped] == [(6, 2, "reader")]


def test_a_quiet_unit_before_the_emergence_block_with_no_outlier_at_its_input_is_kept() -> None:
    """Where block 6's input carries under a quarter of its excess, no outlier exists there
    yet: a unit that goes quiet with the writer before it zeroed is part of the circuit."""
    unit = {(6, 2): {6: 0.05, 7: 0.05, 9: 0.03}}
    kept, dropped = _run(EARLY | unit, {(6, 2): {(5, 0)}}, BASE)
    assert set(kept) == set(EARLY) | {(6, 2)} and not dropped
