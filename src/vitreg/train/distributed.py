"""Data-parallel context: torchrun env init (gloo on CPU, NCCL on GPU), rank slices, reductions."""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
        t = t.detach().clone()
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def setup(device: str | torch.device | None = None) -> DistContext:
    """Join the torchrun group when ``WORLD_SIZE > 1`` (or reuse an existing one); pick a device.

    A group created here stays up for later ``train`` calls in the same process (re-creating
    it on the same rendezvous hangs) and is destroyed at exit.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(_destroy)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if device is None:
        if torch.cuda.is_available():
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        else:
            device = "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return DistContext(rank=rank, world=world, device=dev)


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_slice(n: int, rank: int, world: int) -> range:
    """The positions of a global batch of ``n`` that ``rank`` computes (contiguous, equal sizes)."""
    per = n // world
    return range(rank * per, (rank + 1) * per)
