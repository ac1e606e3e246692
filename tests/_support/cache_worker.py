"""Feature-cache fixtures, and a script run by tests/test_probe_cache.py in a child process.

``python cache_worker.py ROOT slow`` extracts small shards and then stalls at image 6, so the test
can kill it mid-run whatever the machine's load (it waits on shard files, not on a clock);
under ``torchrun ... cache_worker.py ROOT dist`` two ranks extract one cache together.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from PIL import Image

import vitreg
from vitreg import distributed
from vitreg.data.datasets import DataLog, Sample, SkipSample

SPEC = "timm:vit_small_patch14_reg4_dinov2"
STALL_S = 1800


class ToyDataset:
    """Seeded random RGB images with labels and masks; listed indices are bad and get skipped."""

    def __init__(
        self,
        n: int = 6,
        size: int = 40,
        seed: int = 0,
        bad: tuple[int, ...] = (),
        stall_at: int | None = None,
    ) -> None:
        self.name, self.split = "toy", "train"
        self.targets = ("label", "mask", "boxes")
        self.num_classes, self.class_names = 3, ["a", "b", "c"]
        self.log = DataLog()
        self.n, self.size, self.seed, self.bad, self.stall_at = n, size, seed, bad, stall_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Sample:
        if i == self.stall_at:
            time.sleep(STALL_S)  # the test kills the process long before this ends
            raise RuntimeError(f"cache_worker stalled {STALL_S} s at image {i} and was not killed")
        key = f"toy/{i:04d}"
        if i in self.bad:
            self.log.count("unreadable_image", key=key)
            raise SkipSample("unreadable_image", key)
        rng = np.random.default_rng([self.seed, i])
        pixels = rng.integers(0, 256, (self.size, self.size, 3), dtype=np.uint8)
        mask = rng.integers(0, 3, (self.size, self.size)).astype(np.int64)
        box = np.array([[2, 3, 20 + i, 30]], dtype=np.float32)
        return Sample(Image.fromarray(pixels), key, label=i % 3, mask=mask, boxes=box)

    def describe(self) -> dict:
        return {"spec": "toy", "n": self.n, "size": self.size, "seed": self.seed, "bad": self.bad}


def small_vit() -> vitreg.Model:
    """A seeded 2-block DINOv2-reg4 ViT-S at 28 px (1 cls + 4 registers + 2x2 patches)."""
    torch.manual_seed(0)
    return vitreg.load(SPEC, pretrained=False, img_size=28, depth=2)


def main(root: str, mode: str) -> None:
    torch.set_num_threads(1)
    from vitreg.probe import extract

    if mode == "slow":
        data = ToyDataset(n=40, stall_at=6)
        extract(small_vit(), data, root=root, views=("cls", "patches"), shard_size=2, batch_size=2)
        return
    import torch.distributed as dist

    dist.init_process_group("gloo")
    feats = extract(small_vit(), ToyDataset(n=9, bad=(4,)), root=root, shard_size=2, batch_size=2)
    print(f"rank {dist.get_rank()} forward_passes {feats.forward_passes}")
    distributed.exit_process(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
