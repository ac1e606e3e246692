"""What ``diagnose`` costs: every analysis in one pass plus the report, against a plain forward.

On ViT-S/14 (timm ``vit_small_patch14_dinov2``, ``img_size=224``, random weights; ``--models``
and ``--sizes`` give one row per model and size, ``name@depth`` a depth-reduced proxy), over the
same ``--n-images`` synthetic images in batches of ``--batch-size``:

- **plain**: the source module's ``forward_features`` over every batch (``torch.inference_mode``);
- **diagnose**: ``vitreg.analysis.diagnose.diagnose`` with the default analyses (one hooked pass);
- **report**: ``vitreg.report.renderers.diagnose.write_diagnose_run`` for that result (metrics.json, report.md/html,
  figures) into a temporary directory.

After one untimed warm-up of each arm, ``--repeats`` timed rounds alternate plain/diagnose (ABBA)
and each round writes the report once; medians are compared. Target: diagnose + report <=
2 x (plain + report). The plain ratio diagnose / plain is reported too. Each row runs in a fresh
process, and so does each of plain and diagnose once more alone for its peak RSS (less the RSS
after building the model: the arm's working memory).

    python benchmarks/diagnose_speed.py [--n-images 64] [--batch-size 32] [--repeats 3]
        [--models vit_small_patch14_dinov2,vit_base_patch14_dinov2] [--sizes 224,518]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from _common import (
    add_size_and_out_options,
    build,
    emit,
    finish,
    parse_quick,
    parser,
    peak_rss_mb,
    rss_mb,
    run_child,
    verdict,
)
from hooked_forward import model_spec

MODEL = "vit_small_patch14_dinov2"
ARMS = ("plain_forward", "diagnose")
TARGET = 2.0  # (diagnose + report) / (plain forward + report)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time the three arms on one model and one image set."""
    import torch

    from vitreg.analysis.diagnose import diagnose
    from vitreg.configs import DiagnoseConfig
    from vitreg.data.images import to_display
    from vitreg.report.renderers.diagnose import write_diagnose_run as write_run
    from vitreg.testing.images import synthetic_pil

    torch.manual_seed(0)
    name, depth = model_spec(args.model, args.depth)
    model = build(name, args.img_size, depth)
    x = model.preprocess(synthetic_pil(args.n_images, args.img_size, seed=0, flat_fraction=0.1))

    def plain() -> None:
        with torch.inference_mode():
            for batch in x.split(args.batch_size):
                model.module.forward_features(batch)

    def run_diagnose() -> Any:
        return diagnose(model, x, batch_size=args.batch_size, max_maps=args.max_maps)

    def report(result: Any) -> None:
        shown = to_display(x[: args.max_maps], model)
        config = DiagnoseConfig(max_maps=args.max_maps, batch_size=args.batch_size)
        with tempfile.TemporaryDirectory() as out:
            write_run(out, result, images=shown, config=config, command="diagnose_speed.py")

    plain()
    result = run_diagnose()
    report(result)  # warm-up: matplotlib's first figure and font cache
    times: dict[str, list[float]] = {"plain_forward": [], "diagnose": [], "report": []}
    for r in range(args.repeats):
        order = ("plain_forward", "diagnose") if r % 2 == 0 else ("diagnose", "plain_forward")
        for arm in order:
            t0 = time.perf_counter()
            if arm == "plain_forward":
                plain()
            else:
                result = run_diagnose()
            times[arm].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        report(result)
        times["report"].append(time.perf_counter() - t0)
    med = {arm: statistics.median(ts) for arm, ts in times.items()}
    found = result.results
    source = found.attention_source
    return {
        "model": args.model,
        "n_tokens": model.layout_for((args.img_size, args.img_size)).n_tokens,
        "analyses": sorted(
            name
            for name in type(found).model_fields
            if name not in ("not_applicable", "attention_source") and getattr(found, name)
        ),
        "not_applicable": found.not_applicable,
        "attention_source": [source] if isinstance(source, str) else sorted(source or []),
        "verdict": result.verdict,
        "all_seconds": times,
        "seconds": med,
        "images_per_s": {arm: args.n_images / med[arm] for arm in ("plain_forward", "diagnose")},
        "ratios": {
            "diagnose_plus_report_over_plain_plus_report": (med["diagnose"] + med["report"])
            / (med["plain_forward"] + med["report"]),
            "diagnose_over_plain": med["diagnose"] / med["plain_forward"],
        },
        "peak_rss_mb": peak_rss_mb(),
        "img_size": args.img_size,
    }


def arm_peak(args: argparse.Namespace) -> dict[str, float | None]:
    """Peak RSS of one arm (``args.peak_arm``) alone in this fresh process, and less the RSS
    after building the model."""
    import torch

    from vitreg.analysis.diagnose import diagnose
    from vitreg.testing.images import synthetic_pil

    torch.manual_seed(0)
    name, depth = model_spec(args.model, args.depth)
    model = build(name, args.img_size, depth)
    x = model.preprocess(synthetic_pil(args.n_images, args.img_size, seed=0, flat_fraction=0.1))
    built = rss_mb()
    if args.peak_arm == "plain_forward":
        with torch.inference_mode():
            for batch in x.split(args.batch_size):
                model.module.forward_features(batch)
    else:
        diagnose(model, x, batch_size=args.batch_size, max_maps=args.max_maps)
    peak = peak_rss_mb()
    return {"peak_rss_mb": peak, "over_built_mb": None if built is None else peak - built}


def run_row(spec: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """One model at one size in a fresh process, then each arm alone for its peak memory."""
    keys = ("n_images", "batch_size", "repeats", "max_maps", "depth")
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in keys and v]
    shared = [*flags, f"--img-size={size}", f"--model={spec}", "--child"]
    row = run_child(__file__, shared)
    alone = {a: run_child(__file__, [*shared, f"--peak-arm={a}"]) for a in ARMS}
    row["peak_over_built_mb"] = {a: p["over_built_mb"] for a, p in alone.items()}
    row["peak_rss_mb_alone"] = {a: p["peak_rss_mb"] for a, p in alone.items()}
    over = row["peak_over_built_mb"]
    row["peak_ratio_diagnose_over_plain"] = over["diagnose"] / over["plain_forward"]
    return row


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--n-images", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds, interleaved")
    p.add_argument("--max-maps", type=int, default=8, help="images kept for figures")
    p.add_argument("--model", default=MODEL, help="timm model name (name@depth: fewer blocks)")
    p.add_argument("--models", default=None, help="comma-separated models (default: --model)")
    p.add_argument(
        "--sizes", default=None, help="comma-separated image sizes (default: --img-size)"
    )
    add_size_and_out_options(p, "diagnose_speed")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--peak-arm", default=None, choices=ARMS, help=argparse.SUPPRESS)
    return parse_quick(p, argv, n_images=16, batch_size=8, repeats=2, img_size=112, depth=4)


def row_lines(args: argparse.Namespace, res: dict[str, Any]) -> list[str]:
    s, ratio = res["seconds"], res["ratios"]
    main_ratio = ratio["diagnose_plus_report_over_plain_plus_report"]
    over = res["peak_over_built_mb"]
    return [
        f"{res['model']}, {args.n_images} images of {res['img_size']} px, batch {args.batch_size}",
        f"analyses: {', '.join(res['analyses'])}; median of {args.repeats} interleaved rounds",
        f"plain forward {s['plain_forward']:.2f} s, diagnose {s['diagnose']:.2f} s, "
        f"report writing {s['report']:.2f} s",
        f"ratio (diagnose + report) / (plain + report) = {main_ratio:.2f} (target <= {TARGET}: "
        f"{verdict(main_ratio <= TARGET, 'ABOVE TARGET')}); diagnose / plain = "
        f"{ratio['diagnose_over_plain']:.2f}",
        f"working memory alone: plain {over['plain_forward']:.0f} MB, diagnose "
        f"{over['diagnose']:.0f} MB ({res['peak_ratio_diagnose_over_plain']:.2f}x)",
    ]


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child:
        emit(arm_peak(args) if args.peak_arm else measure(args))
        return
    specs = (args.models or args.model).split(",")
    sizes = [int(s) for s in (args.sizes or str(args.img_size)).split(",")]
    rows = []
    for spec in specs:
        for size in sizes:
            print(f"measuring {spec} at {size} px ...", file=sys.stderr, flush=True)
            rows.append(run_row(spec, size, args))
    lines = [line for row in rows for line in row_lines(args, row)]
    res = rows[0] if len(rows) == 1 else {"results": rows}
    finish(
        args,
        "diagnose_speed",
        res,
        lines,
        target=f"(diagnose + report) / (plain forward + report) <= {TARGET}",
    )


if __name__ == "__main__":
    main()
