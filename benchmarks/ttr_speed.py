"""What test-time registers cost at inference: a fixed model against the bare one.

ViT-B/16 (timm ``vit_base_patch16_224``, random weights), one batch of ``--batch-size`` random
images at ``--img-size`` px, both arms under ``torch.inference_mode``:

- **bare**: the source module's ``forward_features(x)``;
- **ttr**: ``model.features(x)`` inside ``TestTimeRegisters(neurons).applied(model)`` with one
  register and a seeded NeuronSet of ``--n-neurons`` units in layers ``--layers`` (default 10
  units in layers 3-5). Only the forward is timed; applying and removing is timed apart.

After ``--warmup`` untimed runs of each arm, ``--repeats`` timed runs alternate bare/ttr (ABBA)
so both arms see the same machine load; medians are compared. Target: ttr images/s >= 0.9 x
bare images/s.

    python benchmarks/ttr_speed.py [--batch-size 32] [--repeats 7] [--warmup 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _common import (
    add_size_and_out_options,
    add_timing_options,
    build,
    finish,
    parse_quick,
    parser,
    peak_rss_mb,
    speed,
    verdict,
)

MODEL = "vit_base_patch16_224"
TARGET = 0.9  # ttr images/s over bare images/s


def neuron_set(model: Any, n: int, layers: range, seed: int = 0) -> Any:
    """``n`` distinct seeded (layer, unit) pairs spread over ``layers``."""
    import torch

    from vitreg.fix.neuron_set import NeuronSet

    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(len(layers) * model.d_mlp, generator=g)[:n].tolist()
    pairs = sorted((layers[i // model.d_mlp], i % model.d_mlp) for i in flat)
    return NeuronSet(
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        [1.0] * n,
        model.spec,
        model.family,
        model.n_layers,
        model.d_mlp,
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time both arms on one model and batch in this process."""
    import torch

    from vitreg.fix.test_time_registers import TestTimeRegisters
    from vitreg.results.schema import plain

    torch.manual_seed(0)
    model = build(args.model, args.img_size, args.depth)
    lo, hi = (int(v) for v in args.layers.split("-"))
    neurons = neuron_set(model, args.n_neurons, range(lo, min(hi, model.n_layers - 1) + 1))
    ttr = TestTimeRegisters(neurons, n_registers=1)
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    apply_s: list[float] = []

    def bare() -> Any:
        with torch.inference_mode():
            return model.module.forward_features(x)

    def fixed(timed: list[float] | None = None) -> Any:
        t0 = time.perf_counter()
        with ttr.applied(model), torch.inference_mode():
            t1 = time.perf_counter()
            out = model.features(x)
            t2 = time.perf_counter()
        apply_s.append((t1 - t0) + (time.perf_counter() - t2))
        if timed is not None:
            timed.append(t2 - t1)
        return out

    for _ in range(args.warmup):
        ref = bare()
    for _ in range(args.warmup):
        out = fixed()
    times: dict[str, list[float]] = {"bare": [], "ttr": []}
    for r in range(args.repeats):
        order = ("bare", "ttr") if r % 2 == 0 else ("ttr", "bare")
        for arm in order:
            if arm == "bare":
                t0 = time.perf_counter()
                bare()
                times["bare"].append(time.perf_counter() - t0)
            else:
                fixed(times["ttr"])
    return {
        "model": args.model,
        "n_tokens": {"bare": ref.shape[1], "ttr_returned": out.shape[1]},
        "fix": plain(ttr.describe()),
        "neurons": [{"layer": layer, "unit": unit} for layer, unit in neurons.pairs()],
        "outputs_differ": bool(not torch.equal(out, ref)),
        **speed(times, args.batch_size, "ratio_ttr_over_bare", over="bare", under="ttr"),
        "apply_remove_median_s": statistics.median(apply_s),
        "peak_rss_mb": peak_rss_mb(),
        "model_left_bare": model.layout.n_extra == 0,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    add_timing_options(p, batch_size=32)
    p.add_argument("--n-neurons", type=int, default=10)
    p.add_argument("--layers", default="3-5", help="inclusive layer range of the neurons")
    p.add_argument("--model", default=MODEL, help="timm model name")
    add_size_and_out_options(p, "ttr_speed")
    return parse_quick(p, argv, batch_size=8, repeats=3, warmup=1, img_size=112, depth=6)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = measure(args)
    ips, ratio, fix = res["images_per_s"], res["ratio_ttr_over_bare"], res["fix"]
    lines = [
        f"{args.model}, batch {args.batch_size}, {args.img_size} px",
        f"{fix['n_neurons']} neurons in layers {fix['layers']}, {fix['n_registers']} register; "
        f"median of {args.repeats} interleaved runs",
        f"bare {ips['bare']:.1f} img/s, ttr {ips['ttr']:.1f} img/s, ratio {ratio:.3f} "
        f"(target >= {TARGET}: {verdict(ratio >= TARGET)}); "
        f"apply+remove {res['apply_remove_median_s'] * 1e3:.1f} ms",
    ]
    finish(
        args,
        "ttr_speed",
        res,
        lines,
        target=f"ttr images/s >= {TARGET} x bare forward_features images/s",
        target_ratio=TARGET,
    )


if __name__ == "__main__":
    main()
