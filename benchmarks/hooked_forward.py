"""Hooked vs plain forward: images/s and peak RSS of a typical analysis pass.

Hooked arm: ``Model.run_with_cache`` keeping the per-token norms of every block's
``hook_resid_post`` and the [CLS] attention row of the last 4 blocks' ``attn.hook_pattern``.
Plain arm: the source module's own ``forward_features``. Both run under ``torch.inference_mode``
on the same random-weight model and batch; after a warm-up the arms alternate (ABBA) so both see
the same machine load. Each model runs in a fresh process so its peak RSS is its own.

    python benchmarks/hooked_forward.py [--batch-size 16] [--repeats 7] [--models a,b]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from _common import (
    add_size_and_out_options,
    add_timing_options,
    build,
    child_flags,
    environment,
    interleaved,
    peak_rss_mb,
    rss_mb,
    run_child,
    write_result,
)

MODELS = "vit_small_patch14_dinov2,vit_base_patch16_224"
TARGET = 0.85  # hooked images/s over plain images/s


def hooked_names(n_layers: int) -> list[str]:
    last = range(max(0, n_layers - 4), n_layers)
    return [f"blocks.{i}.hook_resid_post" for i in range(n_layers)] + [
        f"blocks.{i}.attn.hook_pattern" for i in last
    ]


def reduce(t: Any, hook: Any) -> Any:
    """Token norms for residual sites; the [CLS] query row ``[B, H, n_cls, N]`` for patterns."""
    from vitreg.hooks.reducers import token_norms

    if hook.name.endswith("hook_pattern"):
        return t[:, :, hook.layout.cls]
    return token_norms(t)


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Time both arms on one model in this process."""
    import torch

    torch.manual_seed(0)
    model = build(name, args.img_size, args.depth)
    rss_built = rss_mb()
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    names = hooked_names(model.n_layers)

    def plain() -> Any:
        with torch.inference_mode():
            return model.module.forward_features(x)

    def hooked() -> Any:
        return model.run_with_cache(x, names=names, reduce=reduce)

    for _ in range(args.warmup):
        ref = plain()
    peak_plain = peak_rss_mb()
    for _ in range(args.warmup):
        out, cache = hooked()
    peak_hooked = peak_rss_mb()
    times, med = interleaved({"plain": plain, "hooked": hooked}, args.repeats)
    return {
        "model": name,
        "n_tokens": model.layout.n_tokens,
        "hooked_sites": len(names),
        "attn_source": sorted(set(cache.attn_source.values())),
        "outputs_equal": bool(torch.equal(out, ref)),
        "seconds": times,
        "median_s": med,
        "images_per_s": {arm: args.batch_size / s for arm, s in med.items()},
        "ratio_hooked_over_plain": med["plain"] / med["hooked"],
        "rss_mb_after_build": rss_built,
        "peak_rss_mb": {"after_plain_warmup": peak_plain, "after_hooked_warmup": peak_hooked},
        "environment": environment(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_timing_options(p, batch_size=16)
    p.add_argument("--models", default=MODELS, help="comma-separated timm names")
    add_size_and_out_options(p, "hooked_forward")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child:
        print(json.dumps(measure(args.child, args)))
        return
    shared = child_flags(args, ("batch_size", "repeats", "warmup", "img_size", "depth"))
    results = []
    for name in args.models.split(","):
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        results.append(run_child(__file__, [f"--child={name}", *shared]))
    out = write_result(
        args,
        "hooked_forward",
        target_ratio=TARGET,
        environment=[r.pop("environment") for r in results][0],
        results=results,
    )
    print(f"batch {args.batch_size}, {args.img_size} px, {args.repeats} interleaved repeats")
    for r in results:
        ips = r["images_per_s"]
        verdict = "ok" if r["ratio_hooked_over_plain"] >= TARGET else "BELOW TARGET"
        print(
            f"{r['model']:<28} plain {ips['plain']:6.1f} img/s  hooked {ips['hooked']:6.1f} "
            f"img/s  ratio {r['ratio_hooked_over_plain']:.3f} (target >= {TARGET}: {verdict})  "
            f"peak RSS {r['peak_rss_mb']['after_hooked_warmup']:.0f} MB"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
