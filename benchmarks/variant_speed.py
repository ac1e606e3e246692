"""What [CLS]/patch specialisation costs at inference: a specialised ViT-B/16 against its baseline.

Both arms are built with ``vitreg.arch.create_variant`` from the same timm model (default
``deit3_base_patch16_224``: ViT-B/16 with LayerScale, random weights): the baseline with
``specialize=()``, the variant with ``--specialize`` (default norm+ls+qkv, QKV in the first third
of the blocks). One batch of ``--batch-size`` random images at ``--img-size`` px,
``forward_features`` under ``torch.inference_mode``. After ``--warmup`` untimed runs of each arm,
``--repeats`` timed runs alternate baseline/variant (ABBA) so both arms see the same machine load;
medians are compared. Target: variant images/s >= 0.95 x baseline images/s. Also printed and
written: extra parameters per component (``vitreg.arch.param_report``) and the FLOP check.

    python benchmarks/variant_speed.py [--batch-size 8] [--repeats 7] [--warmup 2]
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import (
    add_size_and_out_options,
    add_timing_options,
    finish,
    interleaved,
    parse_quick,
    parser,
    peak_rss_mb,
    speed,
    verdict,
)

MODEL = "deit3_base_patch16_224"
TARGET = 0.95  # variant images/s over baseline images/s


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time both arms in this process and report their parameters and FLOPs."""
    import torch

    import vitreg  # noqa: F401  (registers the vitreg timm names)
    from vitreg.arch import create_variant, flop_report, param_lines, param_report

    kwargs: dict[str, Any] = {"img_size": args.img_size}
    if args.depth is not None:
        kwargs["depth"] = args.depth
    specialize = tuple(s for s in args.specialize.split(",") if s)
    torch.manual_seed(0)
    arms = {
        "baseline": create_variant(args.model, specialize=(), **kwargs).eval(),
        "variant": create_variant(args.model, specialize=specialize, **kwargs).eval(),
    }
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)

    def run(arm: str) -> None:
        with torch.inference_mode():
            arms[arm].forward_features(x)

    for arm in arms:
        for _ in range(args.warmup):
            run(arm)
    times, _ = interleaved({arm: (lambda arm=arm: run(arm)) for arm in arms}, args.repeats)
    flops = flop_report(arms["variant"])
    report = param_report(arms["variant"])
    return {
        "model": args.model,
        "variant": arms["variant"].variant_config.as_dict(),
        "params": report.model_dump(),
        "params_lines": param_lines(report),
        "flops": flops.model_dump(),
        **speed(
            times, args.batch_size, "ratio_variant_over_baseline", over="baseline", under="variant"
        ),
        "peak_rss_mb": peak_rss_mb(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    add_timing_options(p, batch_size=8)
    p.add_argument("--specialize", default="norm,ls,qkv", help="comma-separated components")
    p.add_argument("--model", default=MODEL, help="timm model name (needs LayerScale for 'ls')")
    add_size_and_out_options(p, "variant_speed")
    return parse_quick(p, argv, batch_size=4, repeats=3, warmup=1, img_size=112, depth=4)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = measure(args)
    ips, ratio = res["images_per_s"], res["ratio_variant_over_baseline"]
    lines = [
        f"{args.model}, specialize={args.specialize}, batch {args.batch_size}, {args.img_size} px",
        f"extra parameters per component (% of the {res['params']['baseline']:,d} baseline):",
        *(f"  {line}" for line in res["params_lines"]),
        f"FLOPs: variant - shared = {res['flops']['delta']['specialisation']}",
        f"baseline {ips['baseline']:.2f} img/s, variant {ips['variant']:.2f} img/s, ratio "
        f"{ratio:.3f} (target >= {TARGET}: {verdict(ratio >= TARGET)}); median of "
        f"{args.repeats} interleaved runs",
    ]
    finish(
        args,
        "variant_speed",
        res,
        lines,
        target=f"variant images/s >= {TARGET} x baseline images/s",
        target_ratio=TARGET,
    )


if __name__ == "__main__":
    main()
