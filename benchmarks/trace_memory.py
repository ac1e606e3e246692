"""Streaming memory: peak RSS of ``Model.trace`` over 20 vs 200 images.

ViT-S/14 (``vit_small_patch14_dinov2``, img_size=224, random weights) with a ``TokenNorms``
reducer on every block's ``hook_resid_post`` and a ``Max`` reducer on every block's
``mlp.hook_post``. Images are synthetic and made batch by batch (never all at once). Each image
count runs in a fresh process, so the peaks are independent; the target is that 200 images stay
within 300 MB of 20 images.

    python benchmarks/trace_memory.py [--n-images 20,200] [--batch-size 10]
"""

from __future__ import annotations

import argparse
import sys
import time
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
    rss_mb,
    run_child,
    synthetic,
    write_result,
)

TARGET_MB = 300.0  # largest allowed growth of the peak from the smallest to the largest run


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Trace ``n`` images through the model in this process and report its memory."""
    import torch

    from vitreg import Max, TokenNorms

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    images = synthetic(n, args.batch_size, args.img_size)
    rss_before, peak_before = rss_mb(), peak_rss_mb()
    t0 = time.perf_counter()
    if args.diagnose:  # every default analysis in one hooked pass, as `vitreg diagnose` runs
        from vitreg.analysis.diagnose import diagnose

        found = diagnose(model, images, batch_size=args.batch_size)
        seconds = time.perf_counter() - t0
        shape, n_done = [], found.data.n_images
    else:
        reducers = [TokenNorms(f"blocks.{i}.hook_resid_post") for i in range(model.n_layers)]
        reducers += [Max(f"blocks.{i}.mlp.hook_post") for i in range(model.n_layers)]
        result = model.trace(images, reducers)
        seconds = time.perf_counter() - t0
        norms = result[f"blocks.{model.n_layers - 1}.hook_resid_post"][0].result()["norms"]
        shape, n_done = list(norms.shape), result.n_images
    return {
        "n_images": n_done,
        "norms_shape": shape,
        "seconds": seconds,
        "images_per_s": n / seconds,
        "rss_mb_before_trace": rss_before,
        "peak_rss_mb_before_trace": peak_before,
        "peak_rss_mb": peak_rss_mb(),
        "diagnose": args.diagnose,
        "environment": environment(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--n-images", default="20,200", help="comma-separated image counts")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--model", default="vit_small_patch14_dinov2")
    p.add_argument(
        "--diagnose", action="store_true", help="run every default analysis (diagnose) instead"
    )
    add_size_and_out_options(p, "trace_memory")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return parse_quick(p, argv, n_images="8,32", batch_size=8, img_size=112, depth=4)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child is not None:
        emit(measure(args.child, args))
        return
    shared = child_flags(args, ("batch_size", "model", "img_size", "depth"))
    shared += ["--diagnose"] if args.diagnose else []
    counts = [int(n) for n in args.n_images.split(",")]
    runs = []
    for n in counts:
        print(f"tracing {n} images in a fresh process ...", file=sys.stderr, flush=True)
        runs.append(run_child(__file__, [f"--child={n}", *shared]))
    growth = runs[-1]["peak_rss_mb"] - runs[0]["peak_rss_mb"]
    out = write_result(
        args,
        "trace_memory",
        target_mb=TARGET_MB,
        environment=[r.pop("environment") for r in runs][0],
        runs=runs,
        peak_growth_mb=growth,
    )
    what = "diagnose (every default analysis)" if args.diagnose else "TokenNorms + Max per block"
    print(f"{args.model} at {args.img_size} px, batch {args.batch_size}, {what}")
    for r in runs:
        print(
            f"{r['n_images']:>5} images: peak RSS {r['peak_rss_mb']:7.1f} MB "
            f"(before trace {r['peak_rss_mb_before_trace']:.1f}), {r['images_per_s']:.1f} img/s"
        )
    verdict = "ok" if growth <= TARGET_MB else "ABOVE TARGET"
    print(f"peak growth {growth:+.1f} MB (target <= {TARGET_MB:.0f} MB: {verdict})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
