"""Hooked vs plain forward: images/s and peak RSS of a typical analysis pass.

Hooked arm: ``Model.run_with_cache`` keeping the per-token norms of every block's
``hook_resid_post`` and the [CLS] attention row of the last 4 blocks' ``attn.hook_pattern``.
Patterns arm: ``Model.trace`` with the reducers of diagnose's ``AttentionAnalysis`` (every
block's ``attn.hook_pattern``, recomputed from q/k under fused attention). Kinds arm: the same
plus the sink and LOF analyses on (``SinkAnalysis`` -- every block's ``attn.hook_v`` paired with
its pattern, sink statistics per head in the hooks -- and ``LOFAnalysis``, which keeps the
penultimate block's patch tokens); their ``finish`` (sink summary, per-image LOF fits) is timed
apart, as it runs once after the forward. Plain arm: the source module's own
``forward_features``. All run under ``torch.inference_mode``/``no_grad`` on the same
random-weight model and batch; after a warm-up the arms alternate so all see the same machine
load. Besides wall-clock ratios it records each arm's CPU seconds (``time.process_time``) and
their ratios, which other jobs on a shared machine skew far less (``--threads 1`` keeps torch's
threads from waiting on each other there), and, of those, the kernel's share and the page faults
(large tensors freed and allocated again fault their pages back in, more or less often as the
allocator trims its heap: part of the run-to-run spread). Each model runs in a fresh process so
its peak RSS is its own.

    python benchmarks/hooked_forward.py [--batch-size 16] [--repeats 7] [--models a,b] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Any

from _common import (
    add_size_and_out_options,
    add_timing_options,
    build,
    child_flags,
    emit,
    environment,
    interleaved,
    parse_quick,
    parser,
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

    from vitreg.analysis.anomaly_lof import LOFAnalysis
    from vitreg.analysis.attention import AttentionAnalysis
    from vitreg.analysis.sinks import SinkAnalysis

    if args.threads:
        torch.set_num_threads(args.threads)
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

    analyses = [AttentionAnalysis(), SinkAnalysis(), LOFAnalysis()]

    def traced(chosen: list[Any]) -> Any:
        reducers = {a.name: a.reducers(model) for a in chosen}
        trace = model.trace(x, [r for rs in reducers.values() for r in rs], batch_size=len(x))
        return trace, reducers

    def patterns() -> Any:
        return traced(analyses[:1])

    def kinds() -> Any:
        return traced(analyses)

    def finish(trace: Any, reducers: dict[str, list[Any]]) -> dict[str, Any]:
        from vitreg.models.model import TraceResult

        done: dict[str, Any] = {}
        for a in analyses[1:]:
            own = TraceResult(reducers[a.name], trace.n_images, trace.layouts, trace.attn_source)
            done[a.name] = a.finish(model, own, done)
        return done

    for _ in range(args.warmup):
        ref = plain()
    peak_plain = peak_rss_mb()
    for _ in range(args.warmup):
        out, cache = hooked()
    peak_hooked = peak_rss_mb()
    for _ in range(args.warmup):
        patterns()
    peak_patterns = peak_rss_mb()
    for _ in range(args.warmup):
        done = finish(*kinds())
    peak_kinds = peak_rss_mb()
    cpu: dict[str, list[float]] = {}
    kernel: dict[str, list[float]] = {}
    faults: dict[str, list[int]] = {}

    def on_cpu(arm: str, fn: Any) -> Any:
        """``fn`` recording the CPU seconds of this process it takes (load-robust work measure),
        the kernel's part of them and the page faults."""

        def run() -> Any:
            u0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
            fn()
            c1, u1 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
            cpu.setdefault(arm, []).append(c1 - c0)
            kernel.setdefault(arm, []).append(u1.ru_stime - u0.ru_stime)
            faults.setdefault(arm, []).append(u1.ru_minflt - u0.ru_minflt)

        return run

    arms = {"plain": plain, "hooked": hooked, "patterns": patterns, "kinds": kinds}
    times, med = interleaved({a: on_cpu(a, f) for a, f in arms.items()}, args.repeats)
    cpu_med = {arm: statistics.median(ts) for arm, ts in cpu.items()}
    finish_s = []
    for _ in range(args.repeats):
        passed = kinds()
        t0 = time.perf_counter()
        done = finish(*passed)
        finish_s.append(time.perf_counter() - t0)
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
        "ratio_patterns_over_plain": med["plain"] / med["patterns"],
        "ratio_kinds_over_plain": med["plain"] / med["kinds"],
        "ratio_kinds_over_patterns": med["patterns"] / med["kinds"],
        "cpu_seconds": cpu,
        "cpu_ratio_over_plain": {a: cpu_med["plain"] / cpu_med[a] for a in arms if a != "plain"},
        "kernel_cpu_seconds_median": {a: statistics.median(ts) for a, ts in kernel.items()},
        "page_faults_median": {a: statistics.median(n) for a, n in faults.items()},
        "kinds_finish_median_s": statistics.median(finish_s),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],  # 1, 5, 15 min
        "kinds_found": {
            "sink_events_per_image": done["sinks"].per_image.total,
            "lof_images": done["lof"].n_images,
        },
        "rss_mb_after_build": rss_built,
        "peak_rss_mb": {
            "after_plain_warmup": peak_plain,
            "after_hooked_warmup": peak_hooked,
            "after_patterns_warmup": peak_patterns,
            "after_kinds_warmup": peak_kinds,
        },
        "environment": environment(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    add_timing_options(p, batch_size=16)
    p.add_argument("--models", default=MODELS, help="comma-separated timm names")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own choice)"
    )
    add_size_and_out_options(p, "hooked_forward")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parse_quick(p, argv, batch_size=8, repeats=3, warmup=1, img_size=112, depth=4)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child:
        emit(measure(args.child, args))
        return
    shared = child_flags(args, ("batch_size", "repeats", "warmup", "img_size", "depth", "threads"))
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
    threads = results[0]["torch_threads"]
    print(
        f"batch {args.batch_size}, {args.img_size} px, {args.repeats} interleaved repeats, "
        f"{threads} torch threads, load average at the end {results[0]['load_average_at_end']}"
    )
    for r in results:
        ips = r["images_per_s"]
        for arm in ("hooked", "patterns", "kinds"):
            ratio = r[f"ratio_{arm}_over_plain"]
            verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
            print(
                f"{r['model']:<28} {arm:<8} plain {ips['plain']:6.1f} img/s  {arm} "
                f"{ips[arm]:6.1f} img/s  ratio {ratio:.3f} (target >= {TARGET}: {verdict})  "
                f"peak RSS {r['peak_rss_mb'][f'after_{arm}_warmup']:.0f} MB; by CPU time "
                f"{r['cpu_ratio_over_plain'][arm]:.3f}"
            )
        print(
            f"{'':<28} kinds / patterns {r['ratio_kinds_over_patterns']:.3f} (the cost of sinks "
            f"and LOF over diagnose's own pattern capture); sink + LOF finish "
            f"{r['kinds_finish_median_s']:.3f} s per batch"
        )
        kernel, faults = r["kernel_cpu_seconds_median"], r["page_faults_median"]
        print(
            f"{'':<28} of the CPU seconds, in the kernel (page faults): "
            + ", ".join(f"{a} {kernel[a]:.2f} s ({faults[a]:.0f})" for a in kernel)
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
