"""Probe training on cached features vs extracting those features.

Training arm: ``vitreg.probe.linear.fit_linear`` on random features (``--n-tokens`` rows ×
``--dim``, ``--classes`` random labels), ``--n-lrs`` learning rates log-spaced in [1e-5, 1e-1]
trained in one batched pass, ``--epochs`` epochs with early stopping off (``patience=None``) so
every epoch runs — the worst case. Extraction arm: ``Model.features`` of a random-weight ViT on
random images under ``torch.inference_mode``; ``--extract-batches`` batches are timed after one
warm-up batch and the median seconds per image is scaled linearly to the
``ceil(n_tokens / tokens_per_image)`` images that yield ``--n-tokens`` tokens (the JSON says so).
Issue 5 target: training takes less time than extraction (ratio < 1).

    python benchmarks/probe_training.py [--n-tokens 10000] [--dim 768] [--n-lrs 8] [--epochs 30]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

from _common import (
    add_size_and_out_options,
    build,
    parse_quick,
    parser,
    write_result,
)

MODEL = "vit_base_patch16_224"


def time_training(args: argparse.Namespace) -> dict[str, Any]:
    """Fit the batched probe once on random features and time it."""
    import torch

    from vitreg.probe.linear import FitSettings, fit_linear

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n_tokens, args.dim, generator=g)
    y = torch.randint(0, args.classes, (args.n_tokens,), generator=g)
    lrs = torch.logspace(-5, -1, args.n_lrs).tolist()
    cfg = FitSettings(
        lrs=lrs, epochs=args.epochs, batch_size=args.batch_size, patience=None, optimizer="adamw"
    )
    t0 = time.perf_counter()
    result = fit_linear(x, y, "ce", out_dim=args.classes, config=cfg)
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "seconds_per_epoch": seconds / args.epochs,
        "n_tokens": args.n_tokens,
        "dim": args.dim,
        "classes": args.classes,
        "lrs": lrs,
        "epochs_run": result.epochs_run,
        "batch_size": args.batch_size,
        "optimizer": cfg.optimizer,
        "val_fraction": cfg.val_fraction,
    }


def time_extraction(args: argparse.Namespace) -> dict[str, Any]:
    """Time a few forward batches of the model and scale to the images ``n_tokens`` needs."""
    import torch

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    x = torch.randn(args.extract_batch_size, 3, args.img_size, args.img_size)
    with torch.inference_mode():
        model.features(x)  # warm-up
        times = []
        for _ in range(args.extract_batches):
            t0 = time.perf_counter()
            model.features(x)
            times.append(time.perf_counter() - t0)
    per_image = statistics.median(times) / args.extract_batch_size
    tokens = model.layout.n_tokens
    n_images = math.ceil(args.n_tokens / tokens)
    return {
        "model": args.model,
        "img_size": args.img_size,
        "depth": args.depth,
        "tokens_per_image": tokens,
        "n_images": n_images,
        "batch_size": args.extract_batch_size,
        "seconds_per_batch": times,
        "seconds_per_image": per_image,
        "estimated_seconds": per_image * n_images,
        "method": (
            f"measured {args.extract_batches} batches of {args.extract_batch_size} images after 1 "
            f"warm-up (Model.features, inference_mode); median s/image × {n_images} images"
        ),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--n-tokens", type=int, default=10_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--n-lrs", type=int, default=8)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=256, help="probe rows per step")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--extract-batch-size", type=int, default=8)
    p.add_argument("--extract-batches", type=int, default=3)
    add_size_and_out_options(p, "probe_training")
    return parse_quick(
        p, argv, n_tokens=2000, epochs=5, extract_batch_size=4, extract_batches=2, img_size=112
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    extraction = time_extraction(args)
    training = time_training(args)
    ratio = training["seconds"] / extraction["estimated_seconds"]
    out = write_result(
        args,
        "probe_training",
        target="training seconds < extraction seconds (ratio < 1)",
        training=training,
        extraction=extraction,
        ratio_training_over_extraction=ratio,
        meets_target=ratio < 1,
    )
    print(
        f"probe training: {args.n_tokens} tokens × {args.dim} dims × {args.n_lrs} lrs, "
        f"{args.classes} classes, {args.epochs} epochs: {training['seconds']:.2f} s"
    )
    print(
        f"extraction ({args.model}, {args.img_size} px): {extraction['n_images']} images × "
        f"{extraction['seconds_per_image']:.3f} s/image ≈ {extraction['estimated_seconds']:.2f} s "
        f"(scaled from {args.extract_batches} batches)"
    )
    verdict = "ok" if ratio < 1 else "ABOVE TARGET"
    print(f"ratio training/extraction {ratio:.3f} (target < 1: {verdict})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
