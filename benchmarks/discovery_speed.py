"""What register-neuron discovery costs: ``discover`` against a plain forward, and its memory.

ViT-B/16 (timm ``vit_base_patch16_224``, random weights), ``--n-images`` synthetic images made
batch by batch (never all at once), batch ``--batch-size``:

- **plain**: the source module's ``forward_features`` over every batch (``torch.inference_mode``);
- **discover**: ``vitreg.neurons.discover.discover`` over the same images.

A random-weight model has no outlier mode, so calibration is skipped: ``detect_layer=-2`` and an
absolute ``threshold`` = the 98th percentile of patch norms at that layer on one warm-up batch
(the first batch of the data stream). After a warm-up of each arm, ``--repeats`` timed passes alternate
plain/discover (ABBA); medians are compared. Target: discover images/s >= 0.7 x plain images/s.
Memory: discovery alone over ``--small-n-images`` and over ``--n-images`` images, each in a
fresh process; the peak RSS must not grow with the image count.

The whole automatic path, ``vitreg.neurons.auto.find_neurons`` (survey of per-block norms,
discovery, causal check on held-out images, calibration of the fix on held-out images), against
a plain forward over the same images. A random-weight model has no outliers (the automatic path
refuses it), so this arm uses the planted demo model ``planted:--planted`` (ViT-S/14 with planted
register neurons) at ``--auto-img-size`` px on ``--auto-n-images`` synthetic images
(``vitreg.testing.images.synthetic_images``, 10% flat, normalised), made batch by batch; every
pass over the source yields the same images (find_neurons reads it several times):

- **plain**: ``forward_features`` over every batch (``torch.inference_mode``);
- **auto**: ``find_neurons(model, images, n_images=N, batch_size=B, progress=...)``, the progress
  callback timing each phase.

After a warm-up (one plain batch, ``--auto-warmup`` automatic runs on 8 images),
``--auto-repeats`` passes alternate plain/auto (ABBA). Target: auto images/s >= 0.5 x plain
images/s. Memory: the automatic path alone over ``--auto-small-n-images`` and ``--auto-n-images``
images, each in a fresh process.

    python benchmarks/discovery_speed.py [--n-images 256] [--batch-size 32] [--repeats 2]
        [--auto-n-images 256] [--auto-small-n-images 64] [--auto-repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from _common import (
    add_size_and_out_options,
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
    synthetic,
    write_result,
)

MODEL = "vit_base_patch16_224"
TARGET = 0.7  # discover images/s over plain images/s
DETECT_LAYER = -2
PERCENTILE = 0.98

PLANTED = "dinov2_s14"  # the automatic path's model: planted:PLANTED
AUTO_TARGET = 0.5  # find_neurons images/s over plain images/s (issue 22)
AUTO_MIN_IMAGES = 8  # every 4th image is held out; the warm-up run uses this many
FLAT_FRACTION = 0.1
SEED_STRIDE = 1_000_003  # batch i of a source with seed s is made from seed s * SEED_STRIDE + i
PHASES = {  # find_neurons progress labels (by prefix) -> short names
    "surveying": "survey",
    "discovering": "discovery",
    "causal check": "causal",
    "checking the fix": "calibration",
}


def warmup_threshold(model: Any, args: argparse.Namespace) -> float:
    """The 98th-percentile patch norm at the detection layer on one warm-up batch."""
    import torch

    x = next(synthetic(args.batch_size, args.batch_size, args.img_size))
    layer = DETECT_LAYER % model.n_layers
    site = f"blocks.{layer}.hook_resid_post"
    _, cache = model.run_with_cache(x, names=site, reduce="norm")
    patches = cache.layout(site).take(cache[site], "patches")
    return float(torch.quantile(patches.flatten().double(), PERCENTILE))


def run_discover(model: Any, n: int, threshold: float, args: argparse.Namespace) -> Any:
    from vitreg.neurons.discover import discover
    from vitreg.settings.neurons import NeuronSearch

    data = synthetic(n, args.batch_size, args.img_size)
    search = NeuronSearch(detect_layer=DETECT_LAYER, threshold=threshold)
    return discover(model, data, search, batch_size=args.batch_size)


def measure_speed(args: argparse.Namespace) -> dict[str, Any]:
    """Time plain forward and discovery over the same images, interleaved, in this process."""
    import torch

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    threshold = warmup_threshold(model, args)
    n = args.n_images

    def plain() -> None:
        with torch.inference_mode():
            for batch in synthetic(n, args.batch_size, args.img_size):
                model.module.forward_features(batch)

    found: dict[str, Any] = {}

    def disc() -> None:
        found["set"] = run_discover(model, n, threshold, args)

    with torch.inference_mode():  # warm-up: one batch of each arm
        model.module.forward_features(next(synthetic(n, args.batch_size, args.img_size)))
    run_discover(model, min(n, args.batch_size), threshold, args)
    times, med = interleaved({"plain": plain, "discover": disc}, args.repeats)
    ips = {arm: n / s for arm, s in med.items()}
    neurons = found["set"]
    return {
        "threshold": {
            "detect_layer": neurons.settings["detect_layer"],
            "rule": "absolute",
            "value": threshold,
            "how": f"{PERCENTILE:.0%} percentile of patch-token norms at the detection layer on "
            f"one warm-up batch (the first {args.batch_size} images); calibration "
            "skipped because a random-weight model has no outlier mode",
        },
        "n_images_with_outliers": neurons.data["n_images_with_outliers"],
        "n_tokens": model.layout_for((args.img_size, args.img_size)).n_tokens,
        "searched_layers": [neurons.settings["lowest_layer"], neurons.settings["highest_layer"]],
        "seconds": times,
        "median_s": med,
        "images_per_s": ips,
        "ratio_discover_over_plain": ips["discover"] / ips["plain"],
        "ratio_per_round": [p / d for p, d in zip(times["plain"], times["discover"], strict=True)],
        "peak_rss_mb": peak_rss_mb(),
    }


def measure_memory(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Discovery alone over ``n`` images in this (fresh) process: its peak RSS."""
    import torch

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    threshold = warmup_threshold(model, args)
    rss_before, peak_before = rss_mb(), peak_rss_mb()
    t0 = time.perf_counter()
    neurons = run_discover(model, n, threshold, args)
    seconds = time.perf_counter() - t0
    return {
        "n_images": neurons.data["n_images"],
        "seconds": seconds,
        "images_per_s": n / seconds,
        "rss_mb_before_discover": rss_before,
        "peak_rss_mb_before_discover": peak_before,
        "peak_rss_mb": peak_rss_mb(),
        "environment": environment(),
    }


class PlantedImages:
    """``n`` synthetic images for a planted model, normalised, made batch by batch on every pass.

    Re-iterable with a fixed length: ``synthetic_images`` gives different images when asked for
    fewer at once, so batch ``i`` has its own seed (``seed * SEED_STRIDE + i``) and every pass
    yields the same images. ``passes`` and ``made`` count the passes started and images made.
    """

    def __init__(self, truth: Any, n: int, batch_size: int, size: int, seed: int = 0) -> None:
        self.truth, self.n, self.batch_size, self.size, self.seed = truth, n, batch_size, size, seed
        self.passes = 0
        self.made = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        from vitreg.testing.images import synthetic_images

        self.passes += 1
        for i, start in enumerate(range(0, self.n, self.batch_size)):
            b = min(self.batch_size, self.n - start)
            x = synthetic_images(
                b, self.size, seed=self.seed * SEED_STRIDE + i, flat_fraction=FLAT_FRACTION
            )
            self.made += b
            yield self.truth.normalize(x)


class PhaseClock:
    """A ``find_neurons`` progress factory that records the wall time of each labelled phase."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.labels: dict[str, str] = {}

    def __call__(self, total: int | None, label: str) -> Any:
        return self._phase(label)

    @contextmanager
    def _phase(self, label: str) -> Iterator[Callable[[int], None]]:
        name = next((v for k, v in PHASES.items() if label.startswith(k)), label)
        self.labels[name] = label
        t0 = time.perf_counter()
        try:
            yield lambda n: None
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def breakdown(self, total: float) -> dict[str, float]:
        """Seconds per phase, plus ``unlabelled``: the rest of ``total`` (taking the first
        ``max_held_out`` held-out images out of the source happens outside every phase)."""
        return {**self.seconds, "unlabelled": total - sum(self.seconds.values())}


def build_planted(args: argparse.Namespace) -> tuple[Any, Any]:
    """The planted demo model wrapped by vitreg, and its ground truth."""
    import vitreg
    from vitreg.testing.planted import build as build_fixture

    module, truth = build_fixture(args.planted, img_size=args.auto_img_size)
    return vitreg.wrap(module, spec=f"planted:{args.planted}"), truth


def planted_images(truth: Any, n: int, args: argparse.Namespace) -> PlantedImages:
    return PlantedImages(truth, n, args.batch_size, args.auto_img_size, seed=args.auto_seed)


def run_auto(model: Any, source: PlantedImages, args: argparse.Namespace, clock: Any) -> Any:
    from vitreg.neurons.auto import find_neurons

    return find_neurons(
        model, source, n_images=len(source), batch_size=args.batch_size, progress=clock
    )


def found_summary(found: Any) -> dict[str, Any]:
    """What the automatic path chose, and how much held-out data it used."""
    return {
        "chosen_pairs": [list(p) for p in found.chosen.pairs()],
        "status": found.status,
        "n_held_out": found.held_out.n_images,
        "n_discovery": found.discovery.n_images,
        "detect_layer": found.detection.detect_layer,
        "searched_layers": [found.detection.lowest_layer, found.detection.highest_layer],
        "causal_passes": found.causal.passes if found.causal is not None else None,
        "causal_images": found.causal.n_images if found.causal is not None else None,
        "calibration_ks": list(found.calibration.ks) if found.calibration is not None else [],
    }


def measure_auto_speed(args: argparse.Namespace) -> dict[str, Any]:
    """Time plain forward and ``find_neurons`` over the same planted images, interleaved."""
    import torch

    from vitreg.errors import VitregError

    torch.manual_seed(0)
    model, truth = build_planted(args)
    n = args.auto_n_images
    source = planted_images(truth, n, args)
    t0 = time.perf_counter()
    for _ in source:  # the images alone: what one pass over the source costs
        pass
    generation_s = time.perf_counter() - t0
    with torch.inference_mode():  # warm-up: one plain batch, --auto-warmup runs on 8 images
        model.module.forward_features(next(iter(source)))
    warmup_error = None
    for _ in range(args.auto_warmup):
        try:
            run_auto(model, planted_images(truth, AUTO_MIN_IMAGES, args), args, PhaseClock())
        except VitregError as e:
            warmup_error = str(e)

    rounds: list[dict[str, Any]] = []
    found: dict[str, Any] = {}

    def plain() -> None:
        with torch.inference_mode():
            for batch in planted_images(truth, n, args):
                model.module.forward_features(batch)

    def auto() -> None:
        clock, src = PhaseClock(), planted_images(truth, n, args)
        t0 = time.perf_counter()
        found["found"] = run_auto(model, src, args, clock)
        total = time.perf_counter() - t0
        found["labels"] = clock.labels
        rounds.append(
            {"phases_s": clock.breakdown(total), "images_made": src.made, "passes": src.passes}
        )

    times, med = interleaved({"plain": plain, "auto": auto}, args.auto_repeats)
    ips = {arm: n / s for arm, s in med.items()}
    phases = {
        name: statistics.median(r["phases_s"][name] for r in rounds)
        for name in rounds[0]["phases_s"]
    }
    summary = found_summary(found["found"])
    # image generation is as dear as a ViT-S forward here; what the ratio is without it (estimate)
    per_image = generation_s / n
    plain_model = med["plain"] - generation_s
    auto_model = med["auto"] - per_image * statistics.median(r["images_made"] for r in rounds)
    return {
        "model": f"planted:{args.planted}",
        "n_images": n,
        "img_size": args.auto_img_size,
        "batch_size": args.batch_size,
        "n_tokens": model.layout_for((args.auto_img_size, args.auto_img_size)).n_tokens,
        "warmup_error": warmup_error,
        "seconds": times,
        "median_s": med,
        "images_per_s": ips,
        "ratio_auto_over_plain": ips["auto"] / ips["plain"],
        "ratio_per_round": [p / a for p, a in zip(times["plain"], times["auto"], strict=True)],
        "phase_labels": found["labels"],
        "phases_per_round": rounds,
        "phase_median_s": phases,
        "causal": {
            "seconds": phases.get("causal"),
            "share_of_auto": phases.get("causal", 0.0) / sum(phases.values()),
            "passes": summary["causal_passes"],
            "n_images": summary["causal_images"],
            "what": "each pass is one forward over at most 16 held-out images up to the "
            "detection layer, some with a backward",
        },
        **summary,
        "source": {
            "generation_s_per_pass": generation_s,
            "images_made_per_auto_run": [r["images_made"] for r in rounds],
            "passes_per_auto_run": [r["passes"] for r in rounds],
            "ratio_without_generation_estimate": plain_model / auto_model
            if plain_model > 0 and auto_model > 0
            else None,
        },
        "peak_rss_mb": peak_rss_mb(),
    }


def measure_auto_memory(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """The automatic path alone over ``n`` images in this (fresh) process: its peak RSS."""
    import torch

    torch.manual_seed(0)
    model, truth = build_planted(args)
    source = planted_images(truth, n, args)
    rss_before, peak_before = rss_mb(), peak_rss_mb()
    clock = PhaseClock()
    t0 = time.perf_counter()
    found = run_auto(model, source, args, clock)
    seconds = time.perf_counter() - t0
    return {
        "n_images": n,
        "seconds": seconds,
        "images_per_s": n / seconds,
        "phases_s": clock.breakdown(seconds),
        **found_summary(found),
        "rss_mb_before_auto": rss_before,
        "peak_rss_mb_before_auto": peak_before,
        "peak_rss_mb": peak_rss_mb(),
        "environment": environment(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--n-images", type=int, default=256)
    p.add_argument("--small-n-images", type=int, default=64, help="memory run to compare with")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2, help="timed passes per arm, interleaved")
    p.add_argument("--model", default=MODEL, help="timm model name")
    add_size_and_out_options(p, "discovery_speed")
    auto = p.add_argument_group("automatic path (find_neurons on a planted model)")
    auto.add_argument("--planted", default=PLANTED, help="planted fixture (vitreg models)")
    auto.add_argument("--auto-n-images", type=int, default=256)
    auto.add_argument(
        "--auto-small-n-images", type=int, default=64, help="memory run to compare with"
    )
    auto.add_argument("--auto-repeats", type=int, default=2, help="timed passes per arm")
    auto.add_argument(
        "--auto-warmup", type=int, default=1, help="untimed automatic runs on 8 images first"
    )
    auto.add_argument("--auto-img-size", type=int, default=224, help="a multiple of the patch")
    auto.add_argument("--auto-seed", type=int, default=0, help="seed of the synthetic images")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parse_quick(
        p,
        argv,
        n_images=16,
        small_n_images=8,
        batch_size=8,
        repeats=1,
        img_size=112,
        depth=4,
        auto_n_images=16,
        auto_small_n_images=8,
        auto_repeats=1,
        auto_warmup=0,
        auto_img_size=112,
    )
    if min(args.auto_n_images, args.auto_small_n_images) < AUTO_MIN_IMAGES:
        p.error(f"the automatic path needs at least {AUTO_MIN_IMAGES} images")
    return args


CHILD_KEYS = ("n_images", "batch_size", "repeats", "model", "img_size", "depth")
AUTO_KEYS = (
    "planted",
    "auto_n_images",
    "auto_repeats",
    "auto_warmup",
    "auto_img_size",
    "auto_seed",
    "auto_small_n_images",
)


def run_in_child(args: argparse.Namespace) -> dict[str, Any]:
    child = args.child
    if child == "speed":
        return measure_speed(args)
    if child == "auto-speed":
        return measure_auto_speed(args)
    if child.startswith("auto-"):
        return measure_auto_memory(int(child.removeprefix("auto-")), args)
    return measure_memory(int(child), args)


def measure_auto(args: argparse.Namespace) -> dict[str, Any]:
    """The automatic path's memory runs and its speed against plain, each in a fresh process."""
    shared = child_flags(args, (*CHILD_KEYS, *AUTO_KEYS))
    runs = []
    for n in (args.auto_small_n_images, args.auto_n_images):
        print(f"automatic path over {n} images in a fresh process ...", file=sys.stderr, flush=True)
        runs.append(run_child(__file__, [f"--child=auto-{n}", *shared]))
    print(
        f"timing plain vs automatic path over {args.auto_n_images} images ...",
        file=sys.stderr,
        flush=True,
    )
    speed = run_child(__file__, ["--child=auto-speed", *shared])
    for r in runs:
        r.pop("environment")
    return {
        "target": f"find_neurons images/s >= {AUTO_TARGET} x plain forward_features images/s; "
        "peak RSS independent of the image count",
        "target_ratio": AUTO_TARGET,
        **speed,
        "memory_runs": runs,
        "peak_rss_growth_mb": runs[-1]["peak_rss_mb"] - runs[0]["peak_rss_mb"],
    }


def print_auto(auto: dict[str, Any], args: argparse.Namespace) -> None:
    ips, ratio = auto["images_per_s"], auto["ratio_auto_over_plain"]
    verdict = "ok" if ratio >= AUTO_TARGET else "BELOW TARGET"
    print(
        f"automatic path (find_neurons) on {auto['model']}, {auto['n_images']} images of "
        f"{auto['img_size']} px, batch {auto['batch_size']}"
    )
    print(
        f"plain {ips['plain']:.1f} img/s, auto {ips['auto']:.1f} img/s, ratio {ratio:.3f} "
        f"(target >= {AUTO_TARGET}: {verdict}); median of {args.auto_repeats} interleaved"
    )
    print("per-round ratios: " + ", ".join(f"{r:.3f}" for r in auto["ratio_per_round"]))
    ph, total = auto["phase_median_s"], sum(auto["phase_median_s"].values())
    print(
        f"phases (median s, total {total:.1f}): "
        + ", ".join(f"{k} {v:.1f} ({v / total:.0%})" for k, v in ph.items())
    )
    c = auto["causal"]
    if c["passes"] is not None:
        print(
            f"causal check: {c['seconds']:.1f} s = {c['share_of_auto']:.0%} of the automatic "
            f"path, {c['passes']} passes over {c['n_images']} held-out images"
        )
    print(
        f"found {auto['chosen_pairs']} (layer, unit), status {auto['status']}, "
        f"{auto['n_held_out']} held-out images used, calibration ks {auto['calibration_ks']}"
    )
    src = auto["source"]
    est = src["ratio_without_generation_estimate"]
    print(
        f"image generation: {src['generation_s_per_pass']:.1f} s per pass of {auto['n_images']} "
        f"images; each automatic run made {src['images_made_per_auto_run'][0]} images in "
        f"{src['passes_per_auto_run'][0]} passes"
        + (f"; ratio without generation ~{est:.3f} (estimate)" if est is not None else "")
    )
    runs = auto["memory_runs"]
    for r in runs:
        print(
            f"{r['n_images']:>5} images: auto peak RSS {r['peak_rss_mb']:7.1f} MB "
            f"(before {r['peak_rss_mb_before_auto']:.1f}), {r['images_per_s']:.1f} img/s"
        )
    print(
        f"auto peak growth {auto['peak_rss_growth_mb']:+.1f} MB from {runs[0]['n_images']} to "
        f"{runs[-1]['n_images']} images"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.child is not None:
        emit(run_in_child(args))
        return
    shared = child_flags(args, CHILD_KEYS)
    runs = []
    for n in (args.small_n_images, args.n_images):
        print(f"discovery over {n} images in a fresh process ...", file=sys.stderr, flush=True)
        runs.append(run_child(__file__, [f"--child={n}", *shared]))
    print(f"timing plain vs discover over {args.n_images} images ...", file=sys.stderr, flush=True)
    speed = run_child(__file__, ["--child=speed", *shared])
    growth = runs[-1]["peak_rss_mb"] - runs[0]["peak_rss_mb"]
    auto = measure_auto(args)
    out = write_result(
        args,
        "discovery_speed",
        target=f"discover images/s >= {TARGET} x plain forward_features images/s; "
        "peak RSS independent of the image count",
        target_ratio=TARGET,
        environment=[r.pop("environment") for r in runs][-1],
        **speed,
        memory_runs=runs,
        peak_rss_growth_mb=growth,
        auto=auto,
    )
    ips, ratio = speed["images_per_s"], speed["ratio_discover_over_plain"]
    verdict = "ok" if ratio >= TARGET else "BELOW TARGET"
    thr = speed["threshold"]
    print(f"{args.model}, {args.n_images} images of {args.img_size} px, batch {args.batch_size}")
    print(
        f"detect layer {thr['detect_layer']}, absolute threshold {thr['value']:.3f} "
        f"(p98 of a warm-up batch); {speed['n_images_with_outliers']} images with outliers"
    )
    print(
        f"plain {ips['plain']:.1f} img/s, discover {ips['discover']:.1f} img/s, ratio "
        f"{ratio:.3f} (target >= {TARGET}: {verdict}); median of {args.repeats} interleaved"
    )
    print("per-round ratios: " + ", ".join(f"{r:.3f}" for r in speed["ratio_per_round"]))
    for r in runs:
        print(
            f"{r['n_images']:>5} images: peak RSS {r['peak_rss_mb']:7.1f} MB "
            f"(before discover {r['peak_rss_mb_before_discover']:.1f})"
        )
    print(
        f"peak growth {growth:+.1f} MB from {runs[0]['n_images']} to {runs[-1]['n_images']} images"
    )
    print_auto(auto, args)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
