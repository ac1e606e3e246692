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
import statistics
import time
from typing import Any

from _common import add_size_and_out_options, add_timing_options, peak_rss_mb, write_result

MODEL = "deit3_base_patch16_224"
TARGET = 0.95  # variant images/s over baseline images/s


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time both arms in this process and report their parameters and FLOPs."""
    import torch

    import vitreg  # noqa: F401  (registers the vitreg timm names)
    from vitreg.arch import create_variant, flop_report, param_report

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

    def run(arm: str) -> float:
        with torch.inference_mode():
            t0 = time.perf_counter()
            arms[arm].forward_features(x)
            return time.perf_counter() - t0

    for arm in arms:
        for _ in range(args.warmup):
            run(arm)
    times: dict[str, list[float]] = {"baseline": [], "variant": []}
    for r in range(args.repeats):
        for arm in ("baseline", "variant") if r % 2 == 0 else ("variant", "baseline"):
            times[arm].append(run(arm))
    med = {arm: statistics.median(ts) for arm, ts in times.items()}
    ips = {arm: args.batch_size / s for arm, s in med.items()}
    flops = flop_report(arms["variant"])
    report = param_report(arms["variant"])
    return {
        "model": args.model,
        "variant": arms["variant"].variant_config.as_dict(),
        "params": report.as_dict(),
        "params_lines": report.lines(),
        "flops": flops,
        "seconds": times,
        "median_s": med,
        "images_per_s": ips,
        "ratio_variant_over_baseline": ips["variant"] / ips["baseline"],
        "ratio_per_round": [
            b / v for b, v in zip(times["baseline"], times["variant"], strict=True)
        ],
        "peak_rss_mb": peak_rss_mb(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_timing_options(p, batch_size=8)
    p.add_argument("--specialize", default="norm,ls,qkv", help="comma-separated components")
    p.add_argument("--model", default=MODEL, help="timm model name (needs LayerScale for 'ls')")
    add_size_and_out_options(p, "variant_speed")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = measure(args)
    out = write_result(
        args,
        "variant_speed",
        target=f"variant images/s >= {TARGET} x baseline images/s",
        target_ratio=TARGET,
        **res,
    )
    ips, ratio = res["images_per_s"], res["ratio_variant_over_baseline"]
    verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
    print(
        f"{args.model}, specialize={args.specialize}, batch {args.batch_size}, {args.img_size} px"
    )
    print(f"extra parameters per component (% of the {res['params']['baseline']:,d} baseline):")
    for line in res["params_lines"]:
        print(f"  {line}")
    print(f"FLOPs: variant - shared = {res['flops']['delta']['specialisation']}")
    print(
        f"baseline {ips['baseline']:.2f} img/s, variant {ips['variant']:.2f} img/s, ratio "
        f"{ratio:.3f} (target >= {TARGET}: {verdict}); median of {args.repeats} interleaved runs"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
