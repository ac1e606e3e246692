"""What the demo's report costs: ``report.html`` size and report-writing time against the
analysis, for ``vitreg diagnose`` with no arguments (the planted demo model on its images).

The run is the library call the CLI makes (``vitreg.run(DiagnoseConfig(...))``) with a
progress object that times each phase: loading, the analysis ("diagnosing ...") and "writing
the report" (metrics.json, figures, report.md, report.html). Targets (issue 19): report.html at
most 3 MB, and writing the report faster than the analysis.

    python benchmarks/report_size.py [--limit N] [--img-size PX] [--out results/report_size.json]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import (
    RESULTS,
    parse_quick,
    parser,
    write_result,
)

MAX_HTML_MB = 3.0


class Timer:
    """A progress object that records the wall time of each phase by its label."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}

    @contextmanager
    def __call__(self, total: int | None, label: str) -> Iterator[Any]:
        t0 = time.perf_counter()
        yield lambda done, **status: None
        self.phases[label] = self.phases.get(label, 0.0) + time.perf_counter() - t0

    def note(self, message: str) -> None:
        return None

    def seconds(self, start: str) -> float:
        """The time of the phases whose label starts with ``start``."""
        return sum(t for label, t in self.phases.items() if label.startswith(start))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo into a temporary folder; its phase times and file sizes."""
    import vitreg
    from vitreg.configs import DiagnoseConfig

    timer = Timer()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo"
        cfg = DiagnoseConfig(out=out, limit=args.limit, img_size=args.img_size)
        vitreg.run(cfg, progress=timer)
        sizes = {p.name: p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    html_mb = sizes["report.html"] / 1e6
    analysis, report = timer.seconds("diagnosing"), timer.seconds("writing the report")
    return {
        "phases_s": timer.phases,
        "analysis_s": analysis,
        "report_s": report,
        "report_over_analysis": report / analysis,
        "html_mb": html_mb,
        "figures_mb": sum(v for k, v in sizes.items() if k.endswith(".png")) / 1e6,
        "files_bytes": sizes,
        "targets": {"html_mb_max": MAX_HTML_MB, "report_over_analysis_max": 1.0},
        "meets_targets": html_mb <= MAX_HTML_MB and report < analysis,
    }


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--limit", type=int, default=None, help="images (default: the demo's)")
    p.add_argument("--img-size", type=int, default=None, help="input size (default: the demo's)")
    p.add_argument("--out", default=str(RESULTS / "report_size.json"))
    args = parse_quick(p, argv, limit=4, img_size=112)
    result = measure(args)
    write_result(args, "report_size", **result)
    print(
        f"report.html {result['html_mb']:.2f} MB (target <= {MAX_HTML_MB:g} MB); report "
        f"{result['report_s']:.1f} s vs analysis {result['analysis_s']:.1f} s "
        f"(ratio {result['report_over_analysis']:.2f}, target < 1); "
        f"{'meets' if result['meets_targets'] else 'MISSES'} the targets"
    )


if __name__ == "__main__":
    main()
