"""Skip the blocks a pass does not change: record the output of block ``k-1`` for every batch of
one pass, then replay it in later passes that change nothing before block ``k``, so those run
blocks ``k..`` only. Exact (block ``k`` sees the very tensors it saw in the recorded pass); used
by searches that run many passes over the same images with edits in late blocks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

from vitreg.hooks.names import hook_name
from vitreg.hooks.sites import OutputSite
from vitreg.models.model import Model

BUDGET_BYTES = 1 << 30  # recorded outputs kept at most (all layers, all batches)


def _copy(output: Any) -> Any:
    """A block's output with its tensors copied (a later block must not edit what is kept)."""
    if isinstance(output, torch.Tensor):
        return output.detach().clone()
    if isinstance(output, tuple | list):
        return type(output)(_copy(o) for o in output)
    return output


def _nbytes(output: Any) -> int:
    if isinstance(output, torch.Tensor):
        return output.numel() * output.element_size()
    if isinstance(output, tuple | list):
        return sum(_nbytes(o) for o in output)
    return 0


class PrefixReplay:
    """Recorded block outputs of one model over a fixed sequence of batches.

    ``batch()`` names the batch being run (the same order in every pass). Plain ViTs only: a
    hierarchical model's blocks change the token grid between stages, so it is never replayed.
    """

    def __init__(
        self, model: Model, batch: Callable[[], int], budget_bytes: int = BUDGET_BYTES
    ) -> None:
        self.model = model
        self.batch = batch
        self.budget = budget_bytes
        self.outputs: dict[int, list[Any]] = {}  # layer k -> per batch, block k-1's output
        self.blocks: list[nn.Module] | None = self._blocks(model)

    @staticmethod
    def _blocks(model: Model) -> list[nn.Module] | None:
        """Each block's module (whose output is ``hook_resid_post``), or None when not plain."""
        if model.adapter.hierarchical:
            return None
        blocks = []
        for layer in range(model.n_layers):
            site = model.site(hook_name(layer, "hook_resid_post"))
            if not isinstance(site, OutputSite) or site.module is None:
                return None
            blocks.append(site.module)
        return blocks

    def used(self) -> int:
        return sum(_nbytes(o) for outs in self.outputs.values() for o in outs)

    @contextmanager
    def record(self, layers: Iterable[int]) -> Iterator[None]:
        """Keep, for each ``k`` of ``layers`` (latest first, within the budget), the output of
        block ``k-1`` in every batch of the pass run inside; the pass must change nothing in the
        blocks before the latest ``k``."""
        if self.blocks is None:
            yield
            return
        wanted = sorted({k for k in layers if 0 < k < len(self.blocks)}, reverse=True)
        kept: dict[int, list[Any]] = {k: [] for k in wanted}

        def keep(k: int) -> Callable[..., None]:
            def hook(_mod: nn.Module, _args: Any, output: Any) -> None:
                kept[k].append(_copy(output))

            return hook

        with ExitStack() as stack:
            for k in wanted:
                stack.callback(self.blocks[k - 1].register_forward_hook(keep(k)).remove)
            yield
        for k in wanted:  # the latest layers save the most compute: they come first
            if not kept[k]:  # the pass ended before that block
                continue
            if self.used() + sum(_nbytes(o) for o in kept[k]) > self.budget:
                break
            self.outputs[k] = kept[k]

    def start(self, first_changed: int) -> int:
        """The latest recorded layer at or before ``first_changed`` (0: none, run everything)."""
        return max((k for k in self.outputs if k <= first_changed), default=0)

    @contextmanager
    def replay(self, k: int) -> Iterator[None]:
        """Inside, blocks ``0..k-1`` do not run: each returns block ``k-1``'s recorded output of
        the current batch (hooks on their outputs still see it; hooks inside them do not run)."""
        if k == 0:
            yield
            return
        assert self.blocks is not None and k in self.outputs
        outputs = self.outputs[k]

        def recorded(*args: Any, **kwargs: Any) -> Any:
            return outputs[self.batch()]

        blocks = self.blocks[:k]
        own = [blk.__dict__.get("forward") for blk in blocks]  # a forward set on the instance
        for blk in blocks:
            blk.forward = recorded
        try:
            yield
        finally:
            for blk, fwd in zip(blocks, own, strict=True):
                if fwd is None:
                    del blk.forward
                else:
                    blk.forward = fwd
