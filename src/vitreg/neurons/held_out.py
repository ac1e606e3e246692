"""The held-out side of the automatic path: which images discovery never sees, and the causal
selection made on them (shared by :mod:`~vitreg.neurons.auto` and its stability check,
:mod:`~vitreg.neurons.stability`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from vitreg.fix.neuron_set import NeuronSet
from vitreg.models.model import Model
from vitreg.neurons.causal import select_causal
from vitreg.progress import Update
from vitreg.results.neurons import Causal, DetectionRecord

HOLD_OUT = 4  # every 4th image (indices 3, 7, 11, ...) is held out


class HeldOutSplit:
    """The held-out part of an image source (every ``period``-th image, by default every
    ``HOLD_OUT``-th) or the rest; re-iterable. ``moved``: source indices that change side."""

    def __init__(
        self,
        source: Any,
        held_out: bool,
        period: int = HOLD_OUT,
        moved: frozenset[int] = frozenset(),
    ) -> None:
        self.source = source
        self.held_out = held_out
        self.period = period
        self.moved = moved

    def source_index(self, i: int) -> int:
        """The source index of the ``i``-th image of this side, before any image moved."""
        if self.held_out:
            return i * self.period + self.period - 1
        return i + i // (self.period - 1)

    def moving(self, indices: frozenset[int]) -> HeldOutSplit:
        """The same side of the source with ``indices`` (source indices) changing side too."""
        return HeldOutSplit(self.source, self.held_out, self.period, self.moved | indices)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for disc, held in self.sides():
            part = held if self.held_out else disc
            if part.shape[0]:
                yield part

    def sides(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Per batch of the source: its discovery images and its held-out ones."""
        from vitreg.models.model import iter_batches

        seen = 0
        for batch in iter_batches(self.source, 32):
            index = torch.arange(seen, seen + batch.shape[0])
            seen += batch.shape[0]
            held = index % self.period == self.period - 1
            if self.moved:
                held ^= torch.tensor([int(i) in self.moved for i in index], dtype=torch.bool)
            yield batch[~held], batch[held]


def causal_set(
    model: Model,
    held: torch.Tensor,
    ranking: NeuronSet,
    detection: DetectionRecord,
    batch_size: int,
    progress: Update | None = None,
) -> Causal:
    """The causal selection among ``ranking``'s units on ``held``, with ``detection``'s layers
    and threshold (the one call the automatic path and its stability check share)."""
    return select_causal(
        model, held, ranking.pairs(), detection, batch_size=min(batch_size, 16), progress=progress
    )
