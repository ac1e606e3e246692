"""Export throughput and memory: ``vitreg.export`` against a plain forward, and its peak memory
at two image counts.

ViT-S/14 (``vit_small_patch14_dinov2``, 224 px, random weights), 3 layers (the last block and
the two at 1/2 and 3/4 depth), ``resid_post``, float16, every token, safetensors shards of
``--shard-size`` images; the images are random tensors made batch by batch. Each image count
runs in a fresh process: it times a plain ``model.features`` pass over the images, then the
export (labels, sink keys and the outlier rule included), both by this process's CPU time, and
reports the export's images/s over the plain forward's, its peak RSS and its write rate in MB/s.
Targets: export >= 0.8 x the plain forward's images/s (CPU time); peak RSS of the largest count
within 300 MB of the smallest (memory is one batch and one shard, whatever the count).

    python benchmarks/export_speed.py [--n-images 1000,10000] [--batch-size 32] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import (
    add_size_and_out_options,
    build,
    child_flags,
    emit,
    environment,
    parse_quick,
    parser,
    peak_rss_mb,
    run_child,
    synthetic,
    verdict,
    write_result,
)

TARGET_RATIO = 0.8  # export images/s over plain-forward images/s, CPU time
TARGET_MB = 300.0  # largest allowed growth of the peak from the smallest to the largest count


class Images:
    """``n`` random images in batches, made lazily each time they are read."""

    def __init__(self, n: int, batch_size: int, size: int) -> None:
        self.n, self.batch_size, self.size, self.total = n, batch_size, size, n

    def __iter__(self) -> Iterator[Any]:
        return synthetic(self.n, self.batch_size, self.size)


def plan(model: Any, args: argparse.Namespace) -> Any:
    import torch

    from vitreg.export import Plan
    from vitreg.export.sites import plan_layers, token_kinds

    last = model.n_layers - 1
    blocks = sorted({last // 2, (3 * last) // 4, last})
    layers = plan_layers("resid_post", blocks, model.n_layers)
    kinds = token_kinds(["patches", "cls", "registers", "extra"])
    return Plan(layers, kinds, [], torch.float16, args.shard_size, ["safetensors"], args.batch_size)


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Plain forward, then export, of ``n`` images in this process."""
    import torch

    from vitreg.export import export
    from vitreg.results.export import ExportSettings

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = build(args.model, args.img_size, args.depth)
    images = Images(n, args.batch_size, args.img_size)
    t0 = time.process_time()
    with torch.inference_mode():
        for batch in images:
            model.features(batch)
    plain_cpu = time.process_time() - t0
    chosen = plan(model, args)
    settings = ExportSettings(
        spec=f"timm:{args.model}", weights="random", sites=[x.site for x in chosen.layers],
        layers=[x.key for x in chosen.layers], tokens=["all"], fix="none", dtype="float16",
        shard_size=args.shard_size, exclude=[], calibration=args.calibration,
        formats=chosen.formats, images="random", limit=None, img_size=args.img_size,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        t0, w0 = time.process_time(), time.perf_counter()
        written = export(Path(tmp), model, images, lambda s, k: [str(i) for i in range(s, s + k)],
                         chosen, settings)  # fmt: skip
        export_cpu, export_wall = time.process_time() - t0, time.perf_counter() - w0
    n_bytes = sum(s.bytes for s in written.index.shards)
    return {
        "n_images": written.index.n_images,
        "n_shards": len(written.index.shards),
        "layers": settings.layers,
        "plain_cpu_s": plain_cpu,
        "export_cpu_s": export_cpu,
        "export_wall_s": export_wall,
        "images_per_s": {"plain": n / plain_cpu, "export": n / export_cpu},
        "ratio_export_over_plain": plain_cpu / export_cpu,
        "bytes_written": n_bytes,
        "write_mb_per_s": n_bytes / 1e6 / export_wall,
        "peak_rss_mb": peak_rss_mb(),
        "environment": environment(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--n-images", default="1000,10000", help="comma-separated image counts")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--shard-size", type=int, default=256, help="images per shard")
    p.add_argument("--calibration", type=int, default=256, help="images the outlier rule fits")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU time is the work)")
    p.add_argument("--model", default="vit_small_patch14_dinov2")
    add_size_and_out_options(p, "export_speed")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return parse_quick(
        p, argv, n_images="16,64", batch_size=8, shard_size=16, calibration=8, img_size=112, depth=4
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child is not None:
        emit(measure(args.child, args))
        return
    keys = ("batch_size", "shard_size", "calibration", "threads", "model", "img_size", "depth")
    shared = child_flags(args, keys)
    runs = []
    for n in [int(x) for x in args.n_images.split(",")]:
        print(f"exporting {n} images in a fresh process ...", file=sys.stderr, flush=True)
        runs.append(run_child(__file__, [f"--child={n}", *shared]))
    growth = runs[-1]["peak_rss_mb"] - runs[0]["peak_rss_mb"]
    ratio = min(r["ratio_export_over_plain"] for r in runs)
    out = write_result(
        args,
        "export_speed",
        target_ratio=TARGET_RATIO,
        target_mb=TARGET_MB,
        environment=[r.pop("environment") for r in runs][0],
        runs=runs,
        ratio_export_over_plain=ratio,
        peak_growth_mb=growth,
        write_mb_per_s=runs[-1]["write_mb_per_s"],
    )
    print(f"{args.model} at {args.img_size} px, batch {args.batch_size}, 3 layers, float16")
    for r in runs:
        ips = r["images_per_s"]
        print(
            f"{r['n_images']:>6} images: export {ips['export']:.1f} img/s vs plain "
            f"{ips['plain']:.1f} (CPU time, ratio {r['ratio_export_over_plain']:.2f}); peak RSS "
            f"{r['peak_rss_mb']:.0f} MB; {r['write_mb_per_s']:.1f} MB/s written"
        )
    print(f"ratio {ratio:.2f} (target >= {TARGET_RATIO}: {verdict(ratio >= TARGET_RATIO)})")
    print(
        f"peak growth {growth:+.1f} MB (target <= {TARGET_MB:.0f} MB: {verdict(growth <= TARGET_MB)})"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
