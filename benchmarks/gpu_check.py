"""The benchmarks' ratios on a GPU: hooked vs plain forward (fused attention left on), discovery vs
plain, the test-time-register fix vs the bare model; ViT-B/16 and ViT-L/14 with random weights,
batch 64, fp32 and bf16 autocast. ``benchmarks/gpu.sh`` runs it after the ``gpu`` tests.

Each arm runs over the same ``--n-batches`` random batches already on the device (the data
pipeline is not what is measured); ``torch.cuda.synchronize`` brackets every timed pass. The
plain and bare arm is the source module's ``forward_features`` under ``torch.inference_mode``;
the fix arm is ``model.features`` inside ``TestTimeRegisters(...).applied`` with 10 seeded units
in the second half of the blocks (applying it is not timed, as in ``ttr_speed.py``). After
one warm-up pass per arm, ``--repeats`` passes alternate the two arms (ABBA) and medians are
compared. Without CUDA (``--device cpu``) it is the fallback path: tiny models and sizes
(``--tiny``), to check that the script itself runs.

    python benchmarks/gpu_check.py [--device cuda] [--batch-size 64] [--repeats 5] [--out F]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from _common import (
    RESULTS,
    build,
    environment,
    parse_quick,
    parser,
    write_json,
)
from hooked_forward import hooked_names, reduce
from ttr_speed import neuron_set

MODELS = "vit_base_patch16_224,vit_large_patch14_dinov2"
TINY = "vit_tiny_patch16_224"
TARGETS = {"hooked_over_plain": 0.85, "discover_over_plain": 0.7, "fix_over_bare": 0.9}


def timed(fn: Callable[[], Any], device: Any) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def ratio(a: Callable[[], float], b: Callable[[], float], repeats: int) -> dict[str, float]:
    """Median seconds of the arms ``a`` and ``b`` (each returns the seconds of one timed pass;
    one warm-up each, then ABBA order) and the speed of ``b`` over ``a``."""
    a(), b()
    times: dict[str, list[float]] = {"a": [], "b": []}
    for r in range(repeats):
        for arm in ("a", "b") if r % 2 == 0 else ("b", "a"):
            times[arm].append(a() if arm == "a" else b())
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"seconds_a": med["a"], "seconds_b": med["b"], "ratio": med["a"] / med["b"]}


def measure(name: str, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    """The three ratios of one model at one precision."""
    import torch

    from vitreg.fix.test_time_registers import TestTimeRegisters
    from vitreg.neurons.discover import discover
    from vitreg.settings.neurons import NeuronSearch

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(0)
    model = build(name, args.img_size, args.depth).to(device)
    g = torch.Generator().manual_seed(0)
    shape = (args.batch_size, 3, args.img_size, args.img_size)
    batches = [torch.randn(*shape, generator=g).to(device) for _ in range(args.n_batches)]
    cast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    )
    names = hooked_names(model.n_layers)
    layers = range(model.n_layers // 2, model.n_layers)
    ttr = TestTimeRegisters(neuron_set(model, 10, layers), n_registers=1)
    site = f"blocks.{model.n_layers - 2}.hook_resid_post"
    with cast:
        _, cache = model.run_with_cache(batches[0], names=site, reduce="norm")
    patches = cache.layout(site).take(cache[site], "patches").flatten().double()
    threshold = float(torch.quantile(patches, 0.98))
    search = NeuronSearch(detect_layer=-2, threshold=threshold)

    def plain() -> float:
        def run() -> None:
            with torch.inference_mode(), cast:
                for x in batches:
                    model.module.forward_features(x)

        return timed(run, device)

    def hooked() -> float:
        def run() -> None:
            with cast:
                for x in batches:
                    model.run_with_cache(x, names=names, reduce=reduce, device=None)

        return timed(run, device)

    def disc() -> float:
        def run() -> None:
            with cast:
                discover(model, batches, search, batch_size=shape[0])

        return timed(run, device)

    def features() -> None:
        with torch.inference_mode(), cast:
            for x in batches:
                model.features(x)

    def fixed() -> float:  # applying and removing the fix is not timed (as in ttr_speed.py)
        with ttr.applied(model):
            return timed(features, device)

    out = {
        "model": name,
        "precision": precision,
        "n_tokens": model.layout.n_tokens,
        "hooked_over_plain": ratio(plain, hooked, args.repeats),
        "discover_over_plain": ratio(plain, disc, args.repeats),
        "fix_over_bare": ratio(plain, fixed, args.repeats),
    }
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    p.add_argument("--models", default=None, help=f"comma-separated timm names ({MODELS})")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--n-batches", type=int, default=4, help="batches per timed pass")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per arm, interleaved")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--depth", type=int, default=None, help="fewer blocks (smoke runs)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: the CPU fallback path")
    p.add_argument("--out", default=str(RESULTS / "gpu_check.json"))
    args = parse_quick(
        p, argv, models="vit_base_patch16_224", batch_size=32, n_batches=2, repeats=3
    )
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.tiny:
        args.models = args.models or TINY
        args.batch_size, args.n_batches, args.repeats = 4, 1, 1
        args.img_size, args.depth = 32, args.depth or 2
    args.models = args.models or MODELS
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    results = []
    for name in args.models.split(","):
        for precision in args.precisions.split(","):
            print(f"measuring {name} {precision} on {args.device} ...", file=sys.stderr)
            results.append(measure(name, precision, args))
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    out = write_json(
        args.out,
        {
            "benchmark": "gpu_check",
            "settings": settings,
            "targets": TARGETS,
            "environment": {**environment(), **device_facts(args.device)},
            "results": results,
        },
    )
    print(f"{args.device}: batch {args.batch_size}, {args.img_size} px, {args.repeats} repeats")
    for r in results:
        cells = "  ".join(f"{k} {r[k]['ratio']:.2f} (>= {t})" for k, t in TARGETS.items())
        print(f"{r['model']:<28} {r['precision']:<5} {cells}")
    print(f"wrote {out}")


def device_facts(device: str) -> dict[str, Any]:
    import torch

    if not device.startswith("cuda"):
        return {"device": "cpu"}
    props = torch.cuda.get_device_properties(torch.device(device))
    return {
        "device": props.name,
        "device_memory_gib": props.total_memory / 2**30,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


if __name__ == "__main__":
    main()
