"""What register-neuron discovery costs: ``discover`` against a plain forward, and its memory.

ViT-B/16 (timm ``vit_base_patch16_224``, random weights), ``--n-images`` synthetic images made
batch by batch (never all at once), batch ``--batch-size``:

- **plain**: the source module's ``forward_features`` over every batch (``torch.inference_mode``);
- **discover**: ``vitreg.neurons.discover.discover`` over the same images.

A random-weight model has no outlier mode, so calibration is skipped: ``detect_layer=-2`` and an
absolute ``threshold`` = the 98th percentile of patch norms at that layer on one warm-up batch
(the first batch of the data stream). After a warm-up of each arm, ``--repeats`` timed passes alternate
plain/discover (ABBA); medians are compared. Target: discover images/s >= 0.7 x plain images/s.
Memory: discovery alone over ``--small-n-images`` and over ``--n-images`` images, each in a
fresh process; the peak RSS must not grow with the image count.

    python benchmarks/discovery_speed.py [--n-images 256] [--batch-size 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from _common import (
    add_size_and_out_options,
    build,
    child_flags,
    environment,
    peak_rss_mb,
    rss_mb,
    run_child,
    write_result,
)

MODEL = "vit_base_patch16_224"
TARGET = 0.7  # discover images/s over plain images/s
DETECT_LAYER = -2
PERCENTILE = 0.98


def synthetic(n: int, batch_size: int, size: int, seed: int = 0) -> Iterator[Any]:
    """``n`` random images in batches, generated lazily."""
    import torch

    g = torch.Generator().manual_seed(seed)
    for start in range(0, n, batch_size):
        yield torch.randn(min(batch_size, n - start), 3, size, size, generator=g)


def warmup_threshold(model: Any, args: argparse.Namespace) -> float:
    """The 98th-percentile patch norm at the detection layer on one warm-up batch."""
    import torch

    x = next(synthetic(args.batch_size, args.batch_size, args.img_size))
    layer = DETECT_LAYER % model.n_layers
    site = f"blocks.{layer}.hook_resid_post"
    _, cache = model.run_with_cache(x, names=site, reduce="norm")
    patches = cache.layout(site).take(cache[site], "patches")
    return float(torch.quantile(patches.flatten().double(), PERCENTILE))


def run_discover(model: Any, n: int, threshold: float, args: argparse.Namespace) -> Any:
    from vitreg.neurons.discover import discover

    data = synthetic(n, args.batch_size, args.img_size)
    return discover(
        model, data, detect_layer=DETECT_LAYER, threshold=threshold, batch_size=args.batch_size
    )


def measure_speed(args: argparse.Namespace) -> dict[str, Any]:
    """Time plain forward and discovery over the same images, interleaved, in this process."""
    import torch

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    threshold = warmup_threshold(model, args)
    n = args.n_images

    def plain() -> None:
        with torch.inference_mode():
            for batch in synthetic(n, args.batch_size, args.img_size):
                model.module.forward_features(batch)

    found: dict[str, Any] = {}

    def disc() -> None:
        found["set"] = run_discover(model, n, threshold, args)

    with torch.inference_mode():  # warm-up: one batch of each arm
        model.module.forward_features(next(synthetic(n, args.batch_size, args.img_size)))
    run_discover(model, min(n, args.batch_size), threshold, args)
    times: dict[str, list[float]] = {"plain": [], "discover": []}
    arms = {"plain": plain, "discover": disc}
    for r in range(args.repeats):
        order = ("plain", "discover") if r % 2 == 0 else ("discover", "plain")
        for arm in order:
            t0 = time.perf_counter()
            arms[arm]()
            times[arm].append(time.perf_counter() - t0)
    med = {arm: statistics.median(ts) for arm, ts in times.items()}
    ips = {arm: n / s for arm, s in med.items()}
    neurons = found["set"]
    return {
        "threshold": {
            "detect_layer": neurons.settings["detect_layer"],
            "rule": "absolute",
            "value": threshold,
            "how": f"{PERCENTILE:.0%} percentile of patch-token norms at the detection layer on "
            f"one warm-up batch (the first {args.batch_size} images); calibration "
            "skipped because a random-weight model has no outlier mode",
        },
        "n_images_with_outliers": neurons.data["n_images_with_outliers"],
        "n_tokens": model.layout_for((args.img_size, args.img_size)).n_tokens,
        "searched_layers": [neurons.settings["lowest_layer"], neurons.settings["highest_layer"]],
        "seconds": times,
        "median_s": med,
        "images_per_s": ips,
        "ratio_discover_over_plain": ips["discover"] / ips["plain"],
        "ratio_per_round": [p / d for p, d in zip(times["plain"], times["discover"], strict=True)],
        "peak_rss_mb": peak_rss_mb(),
    }


def measure_memory(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Discovery alone over ``n`` images in this (fresh) process: its peak RSS."""
    import torch

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    threshold = warmup_threshold(model, args)
    rss_before, peak_before = rss_mb(), peak_rss_mb()
    t0 = time.perf_counter()
    neurons = run_discover(model, n, threshold, args)
    seconds = time.perf_counter() - t0
    return {
        "n_images": neurons.data["n_images"],
        "seconds": seconds,
        "images_per_s": n / seconds,
        "rss_mb_before_discover": rss_before,
        "peak_rss_mb_before_discover": peak_before,
        "peak_rss_mb": peak_rss_mb(),
        "environment": environment(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-images", type=int, default=256)
    p.add_argument("--small-n-images", type=int, default=64, help="memory run to compare with")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2, help="timed passes per arm, interleaved")
    p.add_argument("--model", default=MODEL, help="timm model name")
    add_size_and_out_options(p, "discovery_speed")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child is not None:
        res = (
            measure_speed(args) if args.child == "speed" else measure_memory(int(args.child), args)
        )
        print(json.dumps(res))
        return
    shared = child_flags(args, ("n_images", "batch_size", "repeats", "model", "img_size", "depth"))
    runs = []
    for n in (args.small_n_images, args.n_images):
        print(f"discovery over {n} images in a fresh process ...", file=sys.stderr, flush=True)
        runs.append(run_child(__file__, [f"--child={n}", *shared]))
    print(f"timing plain vs discover over {args.n_images} images ...", file=sys.stderr, flush=True)
    speed = run_child(__file__, ["--child=speed", *shared])
    growth = runs[-1]["peak_rss_mb"] - runs[0]["peak_rss_mb"]
    out = write_result(
        args,
        "discovery_speed",
        target=f"discover images/s >= {TARGET} x plain forward_features images/s; "
        "peak RSS independent of the image count",
        target_ratio=TARGET,
        environment=[r.pop("environment") for r in runs][-1],
        **speed,
        memory_runs=runs,
        peak_rss_growth_mb=growth,
    )
    ips, ratio = speed["images_per_s"], speed["ratio_discover_over_plain"]
    verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
    thr = speed["threshold"]
    print(f"{args.model}, {args.n_images} images of {args.img_size} px, batch {args.batch_size}")
    print(
        f"detect layer {thr['detect_layer']}, absolute threshold {thr['value']:.3f} "
        f"(p98 of a warm-up batch); {speed['n_images_with_outliers']} images with outliers"
    )
    print(
        f"plain {ips['plain']:.1f} img/s, discover {ips['discover']:.1f} img/s, ratio "
        f"{ratio:.3f} (target >= {TARGET}: {verdict}); median of {args.repeats} interleaved"
    )
    print("per-round ratios: " + ", ".join(f"{r:.3f}" for r in speed["ratio_per_round"]))
    for r in runs:
        print(
            f"{r['n_images']:>5} images: peak RSS {r['peak_rss_mb']:7.1f} MB "
            f"(before discover {r['peak_rss_mb_before_discover']:.1f})"
        )
    print(
        f"peak growth {growth:+.1f} MB from {runs[0]['n_images']} to {runs[-1]['n_images']} images"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
