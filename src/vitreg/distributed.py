"""One distributed layer under every verb: torchrun setup, image sharding, reductions, rank-0 writes.

Under ``torchrun`` every rank runs the same command on the same data. The verbs then split the
work and combine it so that every rank ends with the single-process result:

- **Image streams** (:func:`shard`): every rank reads the whole stream of (global) batches and
  forwards only its contiguous part of each batch -- ``torch.tensor_split(batch, world)[rank]``,
  so the first ``len(batch) % world`` ranks take one image more. Each part keeps the global index
  of its first image, so per-image statistics land at their single-process rows. 7 images in
  batches of 32 on 2 ranks: rank 0 forwards images 0-3, rank 1 images 4-6; with batches of 2:
  rank 0 gets 0, 2, 4, 6 and rank 1 gets 1, 3, 5 (with ``batch_size == world`` image ``i`` goes to
  rank ``i % world``). ``--batch-size`` stays the global batch: each rank forwards ``1/world``.
- **Sources that split themselves** (:func:`split`): a source with a ``rank_parts`` method
  (webdataset shards, :mod:`vitreg.data.wds`) hands each rank only its own images, each part
  with the global index of its first image, so no rank reads the others' images. A rank's parts
  are then its own stream: they may be more or fewer than another rank's, nothing collective
  happens between them, and resumable passes restart each rank from its own last checkpoint.
- **Statistics**: :func:`all_reduce_sum` for sums, :func:`all_gather` for per-image rows and any
  picklable object, :func:`merge_reducers` to fold every rank's reducers with ``Reducer.merge``
  (any reducer kind), so ``Model.trace`` -- and everything built on it (``run_analyses``,
  ``diagnose``, the neuron survey, ``compare_fix``) -- returns the single-process result on every
  rank.
- **Files**: :func:`on_main` runs a writer on rank 0 only, then all ranks meet at a barrier.

:func:`local` turns the sharding off in a block, for steps every rank computes whole by itself
(e.g. the small held-out checks of the neuron search). Without a process group (or with one rank)
every function here is the single-process identity.
"""

from __future__ import annotations

import atexit
import copy
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from vitreg.hooks.reducers import Reducer

T = TypeVar("T")

_local_depth = 0  # > 0 inside local(): no sharding


# where this process is -------------------------------------------------------------------------
def initialized() -> bool:
    """Whether a ``torch.distributed`` process group is up."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process' rank (0 without a process group)."""
    return dist.get_rank() if initialized() else 0


def world() -> int:
    """The number of ranks (1 without a process group)."""
    return dist.get_world_size() if initialized() else 1


_group_rank, _group_world = rank, world  # for functions whose arguments shadow the names


def is_main() -> bool:
    """Whether this is rank 0 (the rank that writes files and prints)."""
    return rank() == 0


def under_torchrun() -> bool:
    """Whether torchrun started several processes (``WORLD_SIZE > 1``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def active() -> bool:
    """Whether work is sharded here: a group of more than one rank, outside :func:`local`."""
    return _local_depth == 0 and world() > 1


@contextmanager
def local() -> Iterator[None]:
    """Within the block, ``Model.trace`` and discovery run the whole data on this rank (no
    sharding, no collective): for steps every rank computes identically by itself."""
    global _local_depth
    _local_depth += 1
    try:
        yield
    finally:
        _local_depth -= 1


# joining the group -----------------------------------------------------------------------------
@dataclass
class DistContext:
    """Rank, world size and device of this process."""

    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over ranks (a copy; identity on one process)."""
        return all_reduce_sum(t.detach().clone())

    def barrier(self) -> None:
        barrier()


def setup(device: str | torch.device | None = None) -> DistContext:
    """Join the torchrun group when ``WORLD_SIZE > 1`` (or reuse an existing one); pick a device.

    The backend is NCCL when CUDA is available, else gloo; the default device is
    ``cuda:LOCAL_RANK`` on GPUs, else the CPU. A group created here stays up for later calls in
    the same process (re-creating it on the same rendezvous hangs) and is destroyed at exit.
    """
    if under_torchrun() and not initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(_destroy)
    if device is None:
        if torch.cuda.is_available():
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        else:
            device = "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return DistContext(rank=rank(), world=world(), device=dev)


def _destroy() -> None:
    if initialized():
        dist.destroy_process_group()


def exit_process(code: int = 0) -> NoReturn:
    """End a torchrun rank: destroy the process group, flush the output, exit with ``code``.

    The exit skips the interpreter's teardown: a gloo worker thread can still be releasing the
    tensors of a finished collective while Python finalises, and torch then aborts the process
    (SIGABRT) after a run that succeeded. Every file vitreg writes is closed before this point.
    """
    _destroy()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to save
            pass
    os._exit(code)


def rank_slice(n: int, rank: int, world: int) -> range:
    """The positions of a global batch of ``n`` that ``rank`` computes (contiguous, equal sizes;
    training checks that ``n`` divides)."""
    per = n // world
    return range(rank * per, (rank + 1) * per)


# sharding an image stream ----------------------------------------------------------------------
def part_range(n: int, rank: int, world: int) -> range:
    """The positions of a batch of ``n`` images that ``rank`` forwards (``torch.tensor_split``
    sizes: the first ``n % world`` ranks take one more)."""
    per, extra = divmod(n, world)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (rank < extra))


class Shard:
    """This rank's images of a stream of global batches (see the module docstring for the rule).

    Iterating yields this rank's non-empty parts in stream order; while a part is out,
    :attr:`offset` is the global index of its first image and :attr:`seen` the number of images
    of the whole stream up to the end of its batch. After the loop :attr:`seen` is the stream's
    image count (every rank knows it) and :attr:`mine` this rank's. Rank 0 has a part of every
    non-empty batch, so a progress bar shown by rank 0 sees every batch.
    """

    independent = False  # every rank walks the same global batches: checkpoints resume together

    def __init__(
        self, batches: Iterable[torch.Tensor], rank: int | None = None, world: int | None = None
    ) -> None:
        sharded = active()
        self.batches = batches
        self.rank = rank if rank is not None else (_group_rank() if sharded else 0)
        self.world = world if world is not None else (_group_world() if sharded else 1)
        self.offset = 0
        self.seen = 0
        self.mine = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        self.offset = self.seen = self.mine = 0
        for batch in self.batches:
            n = batch.shape[0]
            part = part_range(n, self.rank, self.world)
            start, self.seen = self.seen, self.seen + n
            if len(part):
                self.offset = start + part.start
                self.mine += len(part)
                yield batch[part.start : part.stop] if self.world > 1 else batch

    def indices(self) -> list[int]:
        """The global indices of this rank's images (runs the stream)."""
        out: list[int] = []
        for part in self:
            out.extend(range(self.offset, self.offset + part.shape[0]))
        return out


def shard(
    batches: Iterable[torch.Tensor], rank: int | None = None, world: int | None = None
) -> Shard:
    """This rank's parts of ``batches`` (an iterable of image tensors ``[B, ...]``); the whole
    stream on one process or inside :func:`local`. ``rank``/``world`` override the group's."""
    return Shard(batches, rank, world)


class RankParts(Protocol):
    """This rank's images of a source that splits itself by rank: ``(global index of the first
    image, images [B, ...])`` pairs in increasing index order; ``total`` is the image count of
    all ranks once the iteration has started."""

    total: int

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]: ...


class RankSplit:
    """This rank's images of a source that splits itself (:func:`split`), with :class:`Shard`'s
    attributes: while a part is out, :attr:`offset` is the global index of its first image and
    :attr:`seen` the global index just past its last (increasing on each rank: the position for
    progress bars and checkpoints); after the loop :attr:`seen` is the image count of all ranks
    and :attr:`mine` this rank's. Ranks may have different numbers of parts."""

    independent = True  # each rank's stream is its own: checkpoints resume per rank

    def __init__(self, parts: RankParts, rank: int, world: int) -> None:
        self.parts = parts
        self.rank = rank
        self.world = world
        self.offset = 0
        self.seen = 0
        self.mine = 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        self.offset = self.seen = self.mine = 0
        for offset, part in self.parts:
            self.offset, self.seen = offset, offset + part.shape[0]
            self.mine += part.shape[0]
            yield part
        self.seen = self.parts.total

    def indices(self) -> list[int]:
        """The global indices of this rank's images (runs the stream)."""
        out: list[int] = []
        for part in self:
            out.extend(range(self.offset, self.offset + part.shape[0]))
        return out


def split(data: Any, limit: int | None = None) -> RankSplit | None:
    """This rank's images when work is sharded and ``data`` splits itself by rank (it has
    ``rank_parts(rank, world, limit)`` returning :class:`RankParts`, or ``None`` to decline);
    ``None`` otherwise: the caller then shards the global batches (:func:`shard`)."""
    parts_of = getattr(data, "rank_parts", None)
    if not active() or parts_of is None:
        return None
    parts = parts_of(rank(), world(), limit)
    return None if parts is None else RankSplit(parts, rank(), world())


# combining results -----------------------------------------------------------------------------
def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks in place (and return it); identity on one process."""
    if world() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` on one process.

    ``dist.all_gather_object`` pickles: fine for statistics and per-image rows of modest size.
    """
    if world() == 1:
        return [obj]
    out: list[Any] = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def gather_rows(rows: dict[int, T]) -> dict[int, T]:
    """Per-image rows keyed by global image index, from every rank, in index order."""
    merged: dict[int, T] = {}
    for part in all_gather(rows):
        merged.update(part)
    return dict(sorted(merged.items()))


def merge_dicts(d: dict[str, T]) -> dict[str, T]:
    """Union of every rank's dict; the lowest rank's non-``None`` value wins per key."""
    merged: dict[str, T] = {}
    for part in all_gather(d):
        for k, v in part.items():
            if merged.get(k) is None:
                merged[k] = v
    return merged


def _portable(r: Reducer) -> Reducer:
    """A shallow copy of ``r`` without callables (readers, modules): only its statistics travel."""
    c = copy.copy(r)
    for k, v in list(vars(c).items()):
        if callable(v):
            delattr(c, k)
    return c


def merge_reducers(reducers: Sequence[Reducer]) -> None:
    """Fold every rank's ``reducers`` (the same list, in the same order, on every rank) in place,
    with ``Reducer.merge`` in rank order: each then holds the statistics of all ranks' images."""
    if world() == 1 or not reducers:
        return
    gathered = all_gather([_portable(r) for r in reducers])
    for j, mine in enumerate(reducers):
        parts = [g[j] for g in gathered]
        if any(type(p) is not type(mine) or p.site != mine.site for p in parts):
            raise RuntimeError(
                f"torchrun ranks traced different reducers at position {j} ({mine.site!r}); "
                "every rank must trace the same reducers"
            )
        n_images = max(p.n_images for p in parts)
        total = parts[0]
        for p in parts[1:]:
            total.merge(p)
        total.n_images = n_images
        vars(mine).update(vars(total))


def barrier() -> None:
    """Wait for every rank (nothing on one process)."""
    if world() > 1:
        dist.barrier()


def on_main(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """``fn(*args, **kwargs)`` on rank 0 only (``None`` elsewhere); then every rank waits at a
    barrier, so the files exist when any rank goes on."""
    out = fn(*args, **kwargs) if is_main() else None
    barrier()
    return out
