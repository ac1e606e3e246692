"""Hooked vs plain forward: images/s and peak memory of a typical analysis pass, per image size.

Hooked arm: ``Model.run_with_cache`` keeping the per-token norms of every block's
``hook_resid_post`` and the [CLS] attention row of the last 4 blocks' ``attn.hook_pattern``.
Patterns arm: ``Model.trace`` with the reducers of diagnose's ``AttentionAnalysis`` (every
block's ``attn.hook_pattern``, streamed from q/k under fused attention: the [CLS] rows alone).
Kinds arm: the same plus the sink and LOF analyses on (``SinkAnalysis`` -- every block's
``attn.hook_v`` paired with its pattern, column sums and sink columns from q/k in query chunks,
so no block holds ``[B, H, N, N]`` -- and ``LOFAnalysis``, which keeps the penultimate block's
patch tokens); their ``finish`` (sink summary, per-image LOF fits) is timed apart, as it runs
once after the forward. Plain arm: the source module's own ``forward_features``. All run under
``torch.inference_mode``/``no_grad`` on the same random-weight model and batch; after a warm-up
the arms alternate so all see the same machine load. Besides wall-clock ratios it records each
arm's CPU seconds (``time.process_time``) and their ratios, which other jobs on a shared machine
skew far less (``--threads 1`` keeps torch's threads from waiting on each other there), and, of
those, the kernel's share and the page faults. Each model and size runs in a fresh process.

Peak memory per arm: on CPU each arm also runs alone in a fresh process (model built, warm-up
passes) and reports its peak RSS, and that peak less the RSS after building (the arm's working
memory); on CUDA the peak allocated memory of each arm (``torch.cuda.max_memory_allocated``).
``--sizes 224,518`` gives one row per model and size; a model ``name@6`` keeps only 6 blocks
(a depth-reduced proxy, e.g. ViT-L/14 on a CPU). ``--device cuda --precision bf16`` measures
on a GPU under bf16 autocast (``benchmarks/gpu.sh`` runs DINOv2-L/14 at 518 px, batch 32).

Compiled arms: ``--compile inductor`` (or another ``torch.compile`` backend) adds, for every arm,
its twin ``<arm>_compiled`` run by a second copy of the model (same weights) whose traced
forward is compiled (``Model.compile``; the plain twin is vitreg's compiled forward with no
analysis hook). All ratios stay over the eager plain arm. The first call of each compiled arm
(its first warm-up; at least one runs) compiles it: its time less the arm's median is written
as ``compile.compile_s``, apart from the timed runs, with the graphs, graph breaks and eager
fallbacks of the compiled forward and the graphs compiled while timing (0: no recompile). The
compiled arms' CPU peak memory is not measured (each fresh process would compile again).

    python benchmarks/hooked_forward.py [--batch-size 16] [--repeats 7] [--models a,b@depth]
        [--sizes 224,518] [--threads 1] [--device cpu|cuda] [--precision fp32|bf16]
        [--compile inductor]

The scale rows: ``--models vit_small_patch14_dinov2,vit_base_patch14_dinov2,
vit_large_patch14_dinov2@6 --sizes 224,518 --threads 1 --batch-size 4 --repeats 3 --warmup 1``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from _common import (
    RESULTS,
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
ARMS = ("plain", "hooked", "patterns", "kinds")
COMPILED = "_compiled"  # the suffix of an arm's compiled twin


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


def model_spec(spec: str, depth: int | None) -> tuple[str, int | None]:
    """``name`` or ``name@depth`` (a depth-reduced proxy); ``--depth`` applies where none is given."""
    name, _, blocks = spec.partition("@")
    return name, int(blocks) if blocks else depth


class Bench:
    """One model at one size on one device: the four arms and the kinds' ``finish``."""

    def __init__(self, spec: str, size: int, args: argparse.Namespace) -> None:
        import torch

        from vitreg.analysis.anomaly_lof import LOFAnalysis
        from vitreg.analysis.attention import AttentionAnalysis
        from vitreg.analysis.sinks import SinkAnalysis

        if args.threads:
            torch.set_num_threads(args.threads)
        self.device = torch.device(args.device)
        torch.manual_seed(0)
        self.model = build(*self._name_size_depth(spec, size, args)).to(self.device)
        self.compiled = None  # the same weights again, its traced forward compiled
        if args.compile:
            torch.manual_seed(0)
            self.compiled = build(*self._name_size_depth(spec, size, args)).to(self.device)
            self.compiled.compile(args.compile)
        self.x = torch.randn(args.batch_size, 3, size, size).to(self.device)
        bf16 = args.precision == "bf16"
        self.cast = (
            (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16))
            if bf16
            else nullcontext
        )
        self.names = hooked_names(self.model.n_layers)
        self.analyses = [AttentionAnalysis(), SinkAnalysis(), LOFAnalysis()]

    @staticmethod
    def _name_size_depth(spec: str, size: int, args: argparse.Namespace) -> tuple:
        name, depth = model_spec(spec, args.depth)
        return name, size, depth

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def plain(self, model: Any = None) -> Any:
        """The source's own ``forward_features``; with ``model`` (the compiled copy), vitreg's
        compiled forward with no analysis hook."""
        import torch

        with torch.inference_mode(), self.cast():
            if model is None:
                out = self.model.module.forward_features(self.x)
            else:
                out = model.features(self.x)
        self.sync()
        return out

    def hooked(self, model: Any = None) -> Any:
        model = model or self.model
        with self.cast():
            out = model.run_with_cache(self.x, names=self.names, reduce=reduce, device=None)
        self.sync()
        return out

    def traced(self, chosen: list[Any], model: Any = None) -> Any:
        model = model or self.model
        with self.cast():
            reducers = {a.name: a.reducers(model) for a in chosen}
            flat = [r for rs in reducers.values() for r in rs]
            trace = model.trace(self.x, flat, batch_size=len(self.x))
        self.sync()
        return trace, reducers

    def patterns(self, model: Any = None) -> Any:
        return self.traced(self.analyses[:1], model)

    def kinds(self, model: Any = None) -> Any:
        return self.traced(self.analyses, model)

    def finish(self, trace: Any, reducers: dict[str, list[Any]]) -> dict[str, Any]:
        from vitreg.models.model import TraceResult

        done: dict[str, Any] = {}
        for a in self.analyses[1:]:
            own = TraceResult(reducers[a.name], trace.n_images, trace.layouts, trace.attn_source)
            done[a.name] = a.finish(self.model, own, done)
        return done

    def arm(self, name: str) -> Callable[[], Any]:
        """The arm ``name``; ``<arm>_compiled`` runs ``<arm>`` on the compiled copy."""
        if name.endswith(COMPILED):
            base = getattr(self, name.removesuffix(COMPILED))
            return lambda: base(self.compiled)
        return getattr(self, name)


def on_cpu(arm: str, fn: Callable[[], Any], record: dict[str, dict[str, list]]) -> Callable:
    """``fn`` recording the CPU seconds of this process it takes (load-robust work measure), the
    kernel's part of them and the page faults."""

    def run() -> Any:
        u0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
        fn()
        c1, u1 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
        record["cpu"].setdefault(arm, []).append(c1 - c0)
        record["kernel"].setdefault(arm, []).append(u1.ru_stime - u0.ru_stime)
        record["faults"].setdefault(arm, []).append(u1.ru_minflt - u0.ru_minflt)

    return run


def cuda_peaks(bench: Bench, arms: tuple[str, ...]) -> dict[str, float]:
    """Peak allocated MB of each arm run alone after a reset (CUDA)."""
    import torch

    peaks = {}
    for arm in arms:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(bench.device)
        bench.arm(arm)()
        peaks[arm] = torch.cuda.max_memory_allocated(bench.device) / 2**20
    return peaks


def measure(spec: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Time the four arms on one model at one size in this process."""
    import torch

    bench = Bench(spec, size, args)
    model = bench.model
    chosen = arms_of(args)
    first = warm_up(bench, chosen, args.warmup)
    graphs = bench.compiled.compiled.report.graphs if bench.compiled is not None else 0
    out, cache = bench.hooked()
    ref = bench.plain()
    record: dict[str, dict[str, list]] = {"cpu": {}, "kernel": {}, "faults": {}}
    arms = {a: on_cpu(a, bench.arm(a), record) for a in chosen}
    times, med = interleaved(arms, args.repeats)
    cpu_med = {arm: statistics.median(ts) for arm, ts in record["cpu"].items()}
    compiled = None
    if bench.compiled is not None:
        compiled = compile_figures(bench, first, med, cpu_med, graphs)
        compiled["plain_max_abs_diff"] = float((bench.plain(bench.compiled) - ref).abs().max())
    finish_s, done = [], None
    for _ in range(args.repeats if "kinds" in chosen else 0):
        passed = bench.kinds()
        t0 = time.perf_counter()
        done = bench.finish(*passed)
        finish_s.append(time.perf_counter() - t0)
    row = {
        "model": spec,
        "img_size": size,
        "device": args.device,
        "precision": args.precision,
        "n_tokens": model.layout.n_tokens,
        "hooked_sites": len(bench.names),
        "attn_source": sorted(set(cache.attn_source.values())),
        "outputs_equal": bool(torch.equal(out, ref)),
        "seconds": times,
        "median_s": med,
        "images_per_s": {arm: args.batch_size / s for arm, s in med.items()},
        **{f"ratio_{a}_over_plain": med["plain"] / med[a] for a in chosen[1:]},
        "ratio_kinds_over_patterns": med["patterns"] / med["kinds"] if "patterns" in med else None,
        "cpu_seconds": record["cpu"],
        "cpu_ratio_over_plain": {a: cpu_med["plain"] / cpu_med[a] for a in chosen[1:]},
        "kernel_cpu_seconds_median": {a: statistics.median(t) for a, t in record["kernel"].items()},
        "page_faults_median": {a: statistics.median(n) for a, n in record["faults"].items()},
        "kinds_finish_median_s": statistics.median(finish_s) if finish_s else None,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],  # 1, 5, 15 min
        "kinds_found": None
        if done is None
        else {
            "sink_events_per_image": done["sinks"].per_image.total,
            "lof_images": done["lof"].n_images,
        },
        "environment": environment(),
    }
    if compiled is not None:
        row["compile"] = compiled
    if bench.device.type == "cuda":
        row["peak_mb"] = cuda_peaks(bench, chosen)
    return row


def warm_up(bench: Bench, arms: tuple[str, ...], rounds: int) -> dict[str, dict[str, float]]:
    """Run every arm ``rounds`` times (a compiled arm at least once); the wall and CPU seconds
    of each compiled arm's first call, which compiles it."""
    first: dict[str, dict[str, float]] = {}
    for r in range(max(rounds, 1 if bench.compiled is not None else 0)):
        for arm in arms:
            if r >= rounds and not arm.endswith(COMPILED):
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            bench.arm(arm)()
            if arm.endswith(COMPILED) and arm not in first:
                first[arm] = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
    return first


def compile_figures(
    bench: Bench,
    first: dict[str, dict[str, float]],
    med: dict[str, float],
    cpu_med: dict[str, float],
    graphs_before: int,
) -> dict[str, Any]:
    """The compiled arms' compile time (first call less the median run), apart from their
    runs, and what the compiled forward did (graphs, graph breaks, eager fallbacks)."""
    report = bench.compiled.compiled.report
    return {
        "backend": report.backend,
        "first_call_s": {a: f["wall_s"] for a, f in first.items()},
        "compile_s": {a: f["wall_s"] - med[a] for a, f in first.items()},
        "compile_cpu_s": {a: f["cpu_s"] - cpu_med[a] for a, f in first.items()},
        "graphs": report.graphs,
        "graph_breaks": report.graph_breaks,
        "fallbacks": report.fallbacks,
        "reasons": report.reasons,
        "graphs_while_timed": report.graphs - graphs_before,
    }


def arm_peak(spec: str, size: int, arm: str, args: argparse.Namespace) -> dict[str, float | None]:
    """Peak RSS of one arm alone in this fresh process, and that peak less the RSS after build."""
    bench = Bench(spec, size, args)
    built = rss_mb()
    for _ in range(max(1, args.warmup)):
        bench.arm(arm)()
    peak = peak_rss_mb()
    return {"peak_rss_mb": peak, "over_built_mb": None if built is None else peak - built}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    add_timing_options(p, batch_size=16)
    p.add_argument("--models", default=MODELS, help="comma-separated timm names (name@depth)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's own choice)"
    )
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument(
        "--sizes", default=None, help="comma-separated image sizes (default: --img-size)"
    )
    p.add_argument("--depth", type=int, default=None, help="fewer blocks (smoke runs)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast")
    p.add_argument(
        "--compile",
        default=None,
        metavar="BACKEND",
        help="also each arm on a copy whose traced forward torch.compile compiles (inductor, ...)",
    )
    p.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated arms of {ARMS} (plain always runs)"
    )
    p.add_argument(
        "--no-peak", action="store_true", help="skip the CPU peak memory (one process per arm)"
    )
    p.add_argument("--out", default=str(RESULTS / "hooked_forward.json"))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--peak-arm", default=None, choices=ARMS, help=argparse.SUPPRESS)
    return parse_quick(p, argv, batch_size=8, repeats=3, warmup=1, img_size=112, depth=4)


def run_row(spec: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """One model at one size: the timed child, then (CPU) one fresh child per arm for its peak."""
    keys = ("batch_size", "repeats", "warmup", "depth", "threads", "device", "precision", "arms")
    shared = [*child_flags(args, (*keys, "compile")), f"--img-size={size}", f"--child={spec}"]
    row = run_child(__file__, shared)
    chosen = arms_of(args)
    if args.device == "cpu" and not args.no_peak:
        eager = [arm for arm in chosen if not arm.endswith(COMPILED)]
        flags = [*child_flags(args, keys), f"--img-size={size}", f"--child={spec}"]
        alone = {arm: run_child(__file__, [*flags, f"--peak-arm={arm}"]) for arm in eager}
        row["peak_rss_mb"] = {arm: a["peak_rss_mb"] for arm, a in alone.items()}
        row["peak_over_built_mb"] = {arm: a["over_built_mb"] for arm, a in alone.items()}
        row["peak_mb"] = row["peak_over_built_mb"]
    if "peak_mb" in row:
        plain = row["peak_mb"]["plain"]
        row["peak_ratio_over_plain"] = {a: mb / plain for a, mb in row["peak_mb"].items()}
    return row


def arms_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The arms ``--arms`` names, plain first, then (``--compile``) their compiled twins."""
    named = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(named) - set(ARMS))
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; choose from {ARMS}")
    eager = ("plain", *[a for a in ARMS[1:] if a in named])
    return (*eager, *[a + COMPILED for a in eager]) if args.compile else eager


def print_row(r: dict[str, Any]) -> None:
    ips, where = r["images_per_s"], f"{r['model']} {r['img_size']}px"
    peaks = r.get("peak_mb")
    for arm in [a for a in ips if a != "plain"]:
        ratio = r[f"ratio_{arm}_over_plain"]
        verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
        peak = (
            f"; peak {peaks[arm]:.0f} MB ({r['peak_ratio_over_plain'][arm]:.2f}x plain's "
            f"{peaks['plain']:.0f} MB)"
            if peaks and arm in peaks
            else ""
        )
        print(
            f"{where:<34} {arm:<8} plain {ips['plain']:6.1f} img/s  {arm} {ips[arm]:6.1f} img/s  "
            f"ratio {ratio:.3f} (target >= {TARGET}: {verdict}); by CPU time "
            f"{r['cpu_ratio_over_plain'][arm]:.3f}{peak}"
        )
    if r["ratio_kinds_over_patterns"] is not None and r["kinds_finish_median_s"] is not None:
        print(
            f"{'':<34} kinds / patterns {r['ratio_kinds_over_patterns']:.3f} (the cost of sinks "
            f"and LOF over diagnose's own pattern capture); sink + LOF finish "
            f"{r['kinds_finish_median_s']:.3f} s per batch"
        )
    kernel, faults = r["kernel_cpu_seconds_median"], r["page_faults_median"]
    print(
        f"{'':<34} of the CPU seconds, in the kernel (page faults): "
        + ", ".join(f"{a} {kernel[a]:.2f} s ({faults[a]:.0f})" for a in kernel)
    )
    if "compile" in r:
        c = r["compile"]
        print(
            f"{'':<34} compiled ({c['backend']}): compile time apart from the runs "
            + ", ".join(f"{a} {t:.1f} s" for a, t in c["compile_s"].items())
            + f"; {c['graphs']} graphs, {c['graph_breaks']} graph breaks, {c['fallbacks']} "
            f"eager fallbacks, {c['graphs_while_timed']} graphs compiled while timed; compiled "
            f"plain vs plain max |diff| {c['plain_max_abs_diff']:.2e}"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    sizes = [int(s) for s in (args.sizes or str(args.img_size)).split(",")]
    if args.child and args.peak_arm:
        emit(arm_peak(args.child, args.img_size, args.peak_arm, args))
        return
    if args.child:
        emit(measure(args.child, args.img_size, args))
        return
    results = []
    for spec in args.models.split(","):
        for size in sizes:
            print(f"measuring {spec} at {size} px ...", file=sys.stderr, flush=True)
            results.append(run_row(spec, size, args))
    out = write_result(
        args,
        "hooked_forward",
        target_ratio=TARGET,
        environment=[r.pop("environment") for r in results][0],
        results=results,
    )
    peaks = "peak memory: working memory of each arm alone (RSS less the built model's)"
    if args.no_peak:
        peaks = "peak memory not measured (--no-peak)"
    if args.device != "cpu":
        peaks = "peak memory: allocated on the device by each arm"
    print(
        f"batch {args.batch_size}, {args.device} {args.precision}, {args.repeats} interleaved "
        f"repeats, {results[0]['torch_threads']} torch threads, load average at the end "
        f"{results[0]['load_average_at_end']}; {peaks}"
    )
    for r in results:
        print_row(r)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
