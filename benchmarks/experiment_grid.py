"""How long the whole variant experiment takes: every entry of the grid (9 variants + GAP)
trained, probed and diagnosed with one preset on synthetic data, on this machine's CPU.

Target: the ``tiny`` preset on ``synthetic:n=256,size=48`` finishes in under 20 minutes on a
2-core machine (one torch thread), so a user can check the pipeline end to end before a GPU run.
Each entry's time is read from the run's own result (``experiment.json``); the total is wall time.

    python benchmarks/experiment_grid.py [--preset tiny] [--data synthetic:n=256,size=48]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    parse_quick,
    parser,
    peak_rss_mb,
    write_result,
)

TARGET_S = 20 * 60


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the grid once in a fresh folder; wall time and what completed."""
    import torch

    from vitreg.experiment import grid, preset, run_variants

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    settings = preset(args.preset)
    if args.steps is not None:
        settings = settings.with_(steps=args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        entries = [v for v in grid() if not args.only or v.name in args.only]
        result = run_variants(args.data, Path(tmp) / "run", settings, variants=entries)
        seconds = time.perf_counter() - t0
    return {
        "complete": bool(result.results.complete),
        "n_variants": len(result.results.variants),
        "variants": [v.name for v in result.results.variants],
        "seconds": seconds,
        "peak_rss_mb": peak_rss_mb(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--data", default="synthetic:n=256,size=48")
    p.add_argument("--steps", type=int, default=None, help="fewer training steps (smoke runs)")
    p.add_argument("--only", action="append", help="run only this grid entry (smoke runs)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "experiment_grid.json"))
    return parse_quick(p, argv, data="synthetic:n=16,size=48", steps=2)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = measure(args)
    out = write_result(args, "experiment_grid", target_seconds=TARGET_S, **res)
    verdict = "ok" if res["complete"] and res["seconds"] < TARGET_S else "BELOW TARGET"
    print(
        f"preset {args.preset} on {args.data}: {res['n_variants']} entries, complete: "
        f"{res['complete']}, {res['seconds'] / 60:.1f} min (target < {TARGET_S // 60} min: "
        f"{verdict}); peak RSS {res['peak_rss_mb']:.0f} MB"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
