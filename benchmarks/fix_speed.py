"""What each training-free fix costs at inference: the fixed model against the unfixed one.

OpenAI-CLIP ViT-B/16 layout (timm ``vit_base_patch16_clip_quickgelu_224``, random weights), one
batch of ``--batch-size`` random images at ``--img-size`` px, under ``torch.inference_mode``;
each method of ``--methods`` (names of ``vitreg fix --method``; ``ttr`` gets a seeded set of
``--n-neurons`` units in layers 3-5) is timed against ``model.features(x)`` without a fix.
After ``--warmup`` untimed runs per arm, ``--repeats`` timed runs alternate bare/fixed (ABBA)
so both arms see the same machine load; medians are compared. ``--clock cpu`` times this
process's CPU seconds on one thread instead of wall time: on a machine shared with other jobs
the ratio then no longer follows their load. Target: every last-block method (clearclip, sclip,
naclip, sc-clip) >= 0.9 x the unfixed images/s.

    python benchmarks/fix_speed.py [--batch-size 16] [--repeats 7] [--methods naclip,sclip]
        [--clock cpu]
"""

from __future__ import annotations

import argparse
import os
import time
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
    verdict,
)
from ttr_speed import neuron_set

MODEL = "vit_base_patch16_clip_quickgelu_224"
METHODS = "clearclip,sclip,naclip,sc-clip,ttr,ttr+naclip"
TARGET = 0.9  # fixed images/s over unfixed images/s, last-block methods


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time every method against the unfixed model on one batch in this process."""
    import torch

    from vitreg.fix.methods import FIXES, FixInputs, parse_entries
    from vitreg.results.schema import plain

    torch.manual_seed(0)
    clock = time.perf_counter
    if args.clock == "cpu":  # one thread: CPU seconds are the work, not other jobs' load
        torch.set_num_threads(1)
        clock = time.process_time
    model = build(args.model, args.img_size, args.depth)
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    top = min(5, model.n_layers - 2)
    inputs = FixInputs(model, neuron_set(model, args.n_neurons, range(min(3, top), top + 1)))
    rows: dict[str, Any] = {}
    for entry in parse_entries(args.methods):
        fix = FIXES.build(entry, inputs)
        last_block = any(m.last_block for m in FIXES.parts(entry)) and "+" not in entry

        def bare() -> Any:
            with torch.inference_mode():
                return model.features(x)

        def fixed(fix: Any = fix) -> Any:
            with fix.applied(model), torch.inference_mode():
                return model.features(x)

        for _ in range(args.warmup):
            bare(), fixed()
        times, med = interleaved({"bare": bare, "fixed": fixed}, args.repeats, clock)
        ratio = med["bare"] / med["fixed"]
        rows[entry] = {
            "fix": plain(fix.describe()) if hasattr(fix, "describe") else {},
            "seconds": times,
            "median_s": med,
            "images_per_s": {arm: args.batch_size / s for arm, s in med.items()},
            "ratio_fixed_over_bare": ratio,
            "last_block_method": last_block,
            "meets_target": ratio >= TARGET if last_block else None,
        }
    return {
        "model": args.model,
        "clock": args.clock,
        "threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()),
        "methods": rows,
        "peak_rss_mb": peak_rss_mb(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    add_timing_options(p, batch_size=16)
    p.add_argument("--methods", default=METHODS, help="comma-separated vitreg fix methods")
    p.add_argument("--n-neurons", type=int, default=10, help="ttr's seeded neuron count")
    p.add_argument("--model", default=MODEL, help="timm model name")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this process's CPU time on one thread (steadier on a shared machine)",
    )
    add_size_and_out_options(p, "fix_speed")
    return parse_quick(p, argv, batch_size=4, repeats=3, warmup=1, img_size=112)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = measure(args)
    load = ", ".join(f"{v:.1f}" for v in res["load_average"])
    lines = [
        f"{args.model}, batch {args.batch_size}, {args.img_size} px, median of {args.repeats} "
        f"({args.clock} clock, {res['threads']} threads, load average {load})"
    ]
    for entry, row in res["methods"].items():
        met = row["meets_target"]
        ips = row["images_per_s"]
        lines.append(
            f"{entry:>12}: {ips['fixed']:.1f} img/s vs {ips['bare']:.1f} unfixed, ratio "
            f"{row['ratio_fixed_over_bare']:.3f} ({'no target' if met is None else verdict(met)})"
        )
    finish(
        args,
        "fix_speed",
        res,
        lines,
        target=f"last-block methods: images/s >= {TARGET} x the unfixed model's",
        target_ratio=TARGET,
    )


if __name__ == "__main__":
    main()
