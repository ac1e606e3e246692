"""Feature-cache throughput: ``vitreg.probe.extract`` vs a plain forward over the same images.

Both arms read the same in-memory random RGB images (``--n-images``, 256 px) and prepare them
with the cache's own ``vitreg.data.transforms.prepare`` (resize, centre crop, normalise) in
batches of ``--batch-size``. Plain arm: the timm module's ``forward_features`` under
``torch.no_grad``. Cache arm: ``extract`` of the last block's default views (cls, registers,
patch mean) into a fresh cache folder each run -- hooks, packing, fp16 shards written
atomically with checksums, the manifest. Arms alternate (ABBA) after a warm-up; medians are
compared. Issue 22 target: cache throughput >= 0.8x the plain forward's.

    python benchmarks/cache_speed.py [--n-images 64] [--batch-size 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from _common import (
    add_size_and_out_options,
    add_timing_options,
    build,
    finish,
    interleaved,
    parse_quick,
    parser,
    speed,
    verdict,
)

TARGET = 0.8  # cache images/s over plain images/s, at least


class RandomImages:
    """``n`` seeded random 256 px RGB images with a label: the LabeledDataset the cache reads."""

    def __init__(self, n: int) -> None:
        import numpy as np
        from PIL import Image

        from vitreg.data.datasets import DataLog

        rng = np.random.default_rng(0)
        self.images = [
            Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)) for _ in range(n)
        ]
        self.name, self.split, self.targets = "random", "train", ("label",)
        self.num_classes, self.class_names = 2, None
        self.log = DataLog()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> Any:
        from vitreg.data.datasets import Sample

        return Sample(self.images[i], f"random/{i:05d}", label=i % 2)

    def describe(self) -> dict:
        return {"spec": "random", "n": len(self.images)}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--n-images", type=int, default=64)
    p.add_argument("--model", default="vit_small_patch14_reg4_dinov2")
    add_timing_options(p, batch_size=32, repeats=5, warmup=1)
    add_size_and_out_options(p, "cache_speed")
    return parse_quick(
        p, argv, n_images=16, batch_size=8, repeats=3, warmup=1, img_size=112, depth=4
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)

    import torch

    from vitreg.data.transforms import prepare
    from vitreg.probe import extract
    from vitreg.probe.cache import input_config

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    data = RandomImages(args.n_images)
    cfg = input_config(model)
    scratch = Path(tempfile.mkdtemp(prefix="vitreg-cache-speed-"))

    def plain() -> None:
        with torch.no_grad():
            for start in range(0, len(data), args.batch_size):
                stop = min(len(data), start + args.batch_size)
                items = [
                    prepare(data[i], cfg["size"], cfg["mean"], cfg["std"])
                    for i in range(start, stop)
                ]
                model.module.forward_features(torch.stack([it["image"] for it in items]))

    def cache() -> None:
        root = Path(tempfile.mkdtemp(dir=scratch))
        extract(model, data, root=root, layers=(-1,), batch_size=args.batch_size, shard_size=256)
        shutil.rmtree(root)

    try:
        for _ in range(args.warmup):
            plain()
            cache()
        times, median = interleaved({"plain": plain, "cache": cache}, args.repeats)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    res = speed(times, args.n_images, "throughput_ratio", "plain", "cache")
    ratio = res["throughput_ratio"]  # plain seconds / cache seconds: cache img/s over plain's
    lines = [f"{args.model} at {cfg['size']} px, {args.n_images} images, batch {args.batch_size}"]
    lines += [
        f"{arm:>6}: {s:7.2f} s median, {args.n_images / s:6.1f} img/s" for arm, s in median.items()
    ]
    lines.append(
        f"cache / plain throughput {ratio:.2f}x (target >= {TARGET}: {verdict(ratio >= TARGET)})"
    )
    finish(args, "cache_speed", res, lines, target=TARGET)


if __name__ == "__main__":
    main()
