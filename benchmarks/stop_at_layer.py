"""What ``stop_at_layer`` saves: probing an early block without running the blocks after it.

ViT-B/16 (timm ``vit_base_patch16_224``, random weights, 12 blocks), one batch of
``--batch-size`` random images at ``--img-size`` px, both arms record the same site:

- **full**: ``model.run_with_cache(x, names="blocks.{L}.hook_resid_post")`` (every block runs);
- **stopped**: the same call with ``stop_at_layer=L + 1`` (blocks ``0..L`` run).

``L`` is ``--layer`` (default 2). After ``--warmup`` untimed runs of each arm, ``--repeats`` timed
runs alternate full/stopped (ABBA) so both arms see the same machine load; medians are compared.
The cached activations must be equal. Target: full seconds / stopped seconds >= 3 (12 blocks
against 3, minus what both pay outside the blocks: patch embedding, caching).

    python benchmarks/stop_at_layer.py [--batch-size 16] [--layer 2] [--repeats 7]
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import (
    add_size_and_out_options,
    add_timing_options,
    build,
    finish,
    interleaved,
    parse_quick,
    parser,
    peak_rss_mb,
    speed,
    verdict,
)

MODEL = "vit_base_patch16_224"
TARGET = 3.0  # stopped images/s over full images/s


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time both arms on one model and batch in this process."""
    import torch

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    layer = args.layer if args.layer >= 0 else model.n_layers + args.layer
    name = f"blocks.{layer}.hook_resid_post"
    stop = model.stop_layer(name)
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)

    def full() -> Any:
        return model.run_with_cache(x, names=name)[1][name]

    def stopped() -> Any:
        return model.run_with_cache(x, names=name, stop_at_layer=stop)[1][name]

    arms = {"full": full, "stopped": stopped}
    for _ in range(args.warmup):
        ref = full()
    for _ in range(args.warmup):
        got = stopped()
    times, _ = interleaved(arms, args.repeats)
    return {
        "model": args.model,
        "n_layers": model.n_layers,
        "site": name,
        "stop_at_layer": stop,
        "blocks_run": {"full": model.n_layers, "stopped": stop},
        "activations_equal": bool(torch.equal(got, ref)),
        **speed(times, args.batch_size, "ratio_full_over_stopped", over="full", under="stopped"),
        "peak_rss_mb": peak_rss_mb(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    add_timing_options(p, batch_size=16)
    p.add_argument("--layer", type=int, default=2, help="block whose hook_resid_post is probed")
    p.add_argument("--model", default=MODEL, help="timm model name")
    add_size_and_out_options(p, "stop_at_layer")
    return parse_quick(p, argv, batch_size=8, repeats=3, warmup=1, img_size=112)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = measure(args)
    ips, ratio = res["images_per_s"], res["ratio_full_over_stopped"]
    lines = [
        f"{args.model} ({res['n_layers']} blocks), batch {args.batch_size}, {args.img_size} px",
        f"run_with_cache of {res['site']}: full vs stop_at_layer={res['stop_at_layer']}; "
        f"median of {args.repeats} interleaved runs; activations equal: {res['activations_equal']}",
        f"full {ips['full']:.1f} img/s, stopped {ips['stopped']:.1f} img/s, speed-up "
        f"{ratio:.2f}x (target >= {TARGET}: {verdict(ratio >= TARGET)})",
    ]
    finish(
        args,
        "stop_at_layer",
        res,
        lines,
        target=f"full seconds / stopped seconds >= {TARGET}",
        target_ratio=TARGET,
    )


if __name__ == "__main__":
    main()
