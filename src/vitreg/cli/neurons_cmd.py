"""``vitreg neurons [SPEC]``: find register neurons, calibrate top-k on held-out images, save them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.diagnose_cmd import (
    DEFAULT_SPEC,
    _command,
    _move,
    _progress,
    _sources,
    default_run_dir,
    slug,
)
from vitreg.cli.inspect_cmd import _load
from vitreg.cli.output import cli_errors, console, err_console, fail
from vitreg.errors import InputError

HOLD_OUT = 4  # every 4th image (indices 3, 7, 11, ...) is held out for top-k calibration
SPLIT_RULE = "every 4th image (indices 3, 7, 11, ...) held out for top-k calibration"
DISCOVER_K = 64  # neurons ranked by discovery when top-k is calibrated
THRESHOLDS = ("auto", "mean3std", "robust")


class Split:
    """The held-out part of an image source (every ``HOLD_OUT``-th image) or the rest; re-iterable."""

    def __init__(self, source: Any, held_out: bool) -> None:
        self.source = source
        self.held_out = held_out

    def __iter__(self) -> Iterator[torch.Tensor]:
        seen = 0
        for batch in self.source:
            index = torch.arange(seen, seen + batch.shape[0])
            seen += batch.shape[0]
            keep = (index % HOLD_OUT == HOLD_OUT - 1) == self.held_out
            if keep.any():
                yield batch[keep]


def split_sizes(n: int) -> tuple[int, int]:
    """(discovery, held-out) image counts for ``n`` images."""
    return n - n // HOLD_OUT, n // HOLD_OUT


@dataclass
class Found:
    """Discovery and top-k selection on one image source."""

    ranking: Any  # NeuronSet: every ranked neuron, best first
    chosen: Any  # NeuronSet: the top-k set to apply
    curve: dict[str, Any] | None  # the calibration curve (None with a fixed top-k)
    held_out: dict[str, Any]  # outlier rate and patch norms on held-out images, k=0 vs top-k
    split: dict[str, Any]


def load_model(spec: str, random_init: bool, img_size: int | None, device: str | None) -> Any:
    """Load ``spec`` (a status line while it builds) and move it to ``device``."""
    with err_console.status(f"loading {spec}"):
        model = _load(spec, not random_init, None, img_size)
    model = _move(model, device)
    for note in model.notes:
        console.print(f"[yellow]note: {escape(note)}[/yellow]")
    return model


def image_source(model: Any, spec: str, opts: dict[str, Any], keep: int = 0) -> Any:
    """The chosen images for ``model`` (folder, samples or synthetic), announced on the console."""
    if opts["images"] is not None:
        from vitreg.data.folder import list_images

        list_images(opts["images"])  # an empty or missing folder fails before any model work
    common = {"batch_size": opts["batch_size"], "max_maps": keep}
    source = _sources(model, spec, opts["images"], opts["samples"], opts["limit"], common)
    colour = "yellow" if source.synthetic else "cyan"
    console.print(f"[{colour}]images: up to {source.total} from {escape(source.label)}[/{colour}]")
    return source


def find_neurons(
    model: Any,
    source: Any,
    *,
    top_k: int | None,
    target: float,
    batch_size: int,
    detect_layer: int | None = None,
    threshold: str | float = "auto",
) -> Found:
    """Discover on 3 of every 4 images; choose top-k on the held-out 4th (or take ``top_k``)."""
    from vitreg.neurons import calibrate_top_k, discover
    from vitreg.neurons.calibrate import DEFAULT_KS, fixed_outlier_stats

    n_disc, n_held = split_sizes(source.total)
    if n_held < 1:
        raise InputError(
            f"discovery holds out every {HOLD_OUT}th image to calibrate and check top-k, so it "
            f"needs at least {HOLD_OUT} images and got {source.total}; pass more (--limit, "
            "--images DIR)"
        )
    console.print(f"split: {n_disc} images for discovery, {n_held} held out ({SPLIT_RULE})")
    with _progress(n_disc, "discovering register neurons") as progress:
        ranking = discover(
            model,
            Split(source, held_out=False),
            detect_layer=detect_layer,
            threshold=threshold,
            top_k=top_k or DISCOVER_K,
            batch_size=batch_size,
            progress=progress,
        )
    held = torch.cat(list(Split(source, held_out=True)))
    s = ranking.settings
    curve = None
    if top_k is None:
        ks = sorted({k for k in DEFAULT_KS if k <= len(ranking)} | {len(ranking)})
        with _progress(len(ks), "calibrating top-k on held-out images") as progress:
            chosen, found = calibrate_top_k(
                model, ranking, held, target=target, ks=ks, batch_size=batch_size, progress=progress
            )
        curve = found.to_dict()
        rates, maxima, medians = (found.outlier_rate[0], found.max_norm[0], found.median_norm[0])
        if found.chosen_k == 0:
            raise InputError(
                f"the {len(held)} held-out images already have a patch outlier rate of "
                f"{rates[0]:.2%} (at most the target {target:.2%}) at layer {s['detect_layer']} "
                "without any fix, so top-k cannot be calibrated on them; use more images "
                "(--limit, --images DIR), a lower --target, or a fixed --top-k K"
            )
        before, after = (rates[0], maxima[0], medians[0]), (rates[-1], maxima[-1], medians[-1])
    else:
        chosen = ranking
        args = (held, s["detect_layer"], s["threshold"], s["threshold_value"])
        before = fixed_outlier_stats(model, ranking.top(0), *args, batch_size=batch_size)
        after = fixed_outlier_stats(model, chosen, *args, batch_size=batch_size)
    stats = {"n_images": len(held), "k": len(chosen)}
    for when, (rate, mx, med) in (("before", before), ("after", after)):
        stats.update(
            {
                f"outlier_rate_{when}": rate,
                f"max_patch_norm_{when}": mx,
                f"median_patch_norm_{when}": med,
            }
        )
    split = {"rule": SPLIT_RULE, "n_discovery": ranking.data["n_images"], "n_held_out": len(held)}
    return Found(ranking, chosen, curve, stats, split)


def neuron_rows(neurons: Any) -> list[dict[str, Any]]:
    return [
        {"layer": layer, "unit": unit, "score": score}
        for layer, unit, score in zip(neurons.layers, neurons.units, neurons.scores, strict=True)
    ]


def layer_counts(neurons: Any) -> list[dict[str, int]]:
    return [{"layer": k, "n_neurons": len(v)} for k, v in neurons.by_layer().items()]


def results_of(found: Found, target: float) -> dict[str, Any]:
    """The ``results`` block of metrics.json for one discovery."""
    s = found.ranking.settings
    return {
        "n_neurons": len(found.chosen),
        "chosen_k": len(found.chosen),
        "top_k_mode": "calibrated" if found.curve is not None else "fixed",
        "target": target,
        **{k: s[k] for k in ("detect_layer", "highest_layer", "lowest_layer", "threshold")},
        "threshold_value": s["threshold_value"],
        "layers": layer_counts(found.chosen),
        "neurons": neuron_rows(found.chosen),
        "ranking": neuron_rows(found.ranking),
        "held_out": found.held_out,
        "calibration": found.curve,
        "discovery": found.ranking.data,
        "notes": list((found.curve or {}).get("notes", [])),
    }


def parse_top_k(value: str) -> int | None:
    """``auto`` -> None (calibrate), else a positive integer."""
    if value == "auto":
        return None
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise fail(f"--top-k takes 'auto' or a positive integer, got {value!r}")


def parse_threshold(value: str) -> str | float:
    """``auto``, ``mean3std``, ``robust`` or an absolute norm."""
    if value in THRESHOLDS:
        return value
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if number > 0:
        return number
    raise fail(f"--threshold takes {', '.join(THRESHOLDS)} or a positive number, got {value!r}")


def neurons_command(
    spec: str | None = opt.SPEC,
    images: Path | None = opt.IMAGES,
    samples: bool = opt.SAMPLES,
    top_k: str = typer.Option(
        "auto",
        "--top-k",
        help="'auto': the smallest k meeting --target on held-out images; or a number of neurons.",
    ),
    target: float = typer.Option(
        0.01, "--target", min=0.0, max=1.0, help="Held-out patch outlier rate top-k must reach."
    ),
    out: Path | None = opt.out_dir("neurons"),
    limit: int | None = opt.LIMIT,
    batch_size: int = opt.BATCH_SIZE,
    img_size: int | None = opt.IMG_SIZE,
    random_init: bool = opt.RANDOM_INIT,
    detect_layer: int | None = typer.Option(
        None, "--detect-layer", help="Block whose output defines outliers (default: strongest)."
    ),
    threshold: str = typer.Option(
        "auto",
        "--threshold",
        help="Outlier rule: auto (valley of the norm histogram), mean3std, robust, or a norm.",
    ),
) -> None:
    """Find register neurons: discovery, top-k calibration on held-out images, a NeuronSet file."""
    if images is not None and samples:
        raise fail("--images and --samples exclude each other; pass one of them")
    k = parse_top_k(top_k)
    rule = parse_threshold(threshold)
    if spec is None:
        console.print(
            f"[yellow]No model given: running the embedded demo, {DEFAULT_SPEC}, a synthetic "
            "ViT with planted register neurons, on synthetic images. Pass a SPEC (see `vitreg "
            "models`) for a real model.[/yellow]"
        )
    spec = spec or DEFAULT_SPEC
    opts = {"images": images, "samples": samples, "limit": limit, "batch_size": batch_size}
    with cli_errors():
        run_dir = out if out is not None else default_run_dir(slug(spec), verb="neurons")
        set_opts = {"top_k": top_k, "target": target, "detect_layer": detect_layer}
        command = _command(
            spec,
            {
                **opts,
                **set_opts,
                "threshold": threshold,
                "img_size": img_size,
                "random_init": random_init,
                "out": run_dir,
            },
            verb="neurons",
        )
        model = load_model(spec, random_init, img_size, None)
        source = image_source(model, spec, opts)
        found = find_neurons(
            model,
            source,
            top_k=k,
            target=target,
            batch_size=batch_size,
            detect_layer=detect_layer,
            threshold=rule,
        )
        write(run_dir, model, source, found, target, opts, set_opts, img_size, command)
    show(found, spec, run_dir)


def write(
    run_dir: Path,
    model: Any,
    source: Any,
    found: Found,
    target: float,
    opts: dict,
    set_opts: dict,
    img_size: int | None,
    command: str,
) -> None:
    """The NeuronSet files, then the report (metrics.json last)."""
    from vitreg.report.fix_report import write_neurons_run

    data = {**source.description(), "split": found.split}
    found.chosen.data = {**found.chosen.data, "images": source.label, "split": found.split}
    with err_console.status("writing the neuron set and the report"):
        (run_dir / "metrics.json").unlink(missing_ok=True)  # never beside a newer neuron set
        found.chosen.save(run_dir / "neurons")
        results = results_of(found, target)
        results["files"] = {"json": "neurons.json", "tensors": "neurons.safetensors"}
        config = {
            "command": "neurons",
            "spec": model.spec,
            **{k: str(v) if isinstance(v, Path) else v for k, v in opts.items()},
            **set_opts,
            "threshold": found.ranking.settings["threshold"],
            "threshold_value": found.ranking.settings["threshold_value"],
            "img_size": img_size,
            "split": SPLIT_RULE,
        }
        write_neurons_run(
            run_dir,
            described=model.describe(),
            data=data,
            config=config,
            results=results,
            command=command,
        )


def show(found: Found, spec: str, run_dir: Path) -> None:
    """The console summary and the next step."""
    held = found.held_out
    s = found.ranking.settings
    table = Table(title="vitreg neurons", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    layers = ", ".join(f"{r['layer']} ({r['n_neurons']})" for r in layer_counts(found.chosen))
    mode = "calibrated" if found.curve is not None else "fixed"
    rows = {
        "neurons": f"{len(found.chosen)} (top-k {mode})",
        "layers (count)": layers,
        "detection": f"block {s['detect_layer']}, {s['threshold']} threshold",
        "held-out outlier rate": f"{held['outlier_rate_before']:.2%} -> "
        f"{held['outlier_rate_after']:.2%} ({held['n_images']} images)",
    }
    for key, value in rows.items():
        table.add_row(key, escape(value))
    console.print(table)
    for note in (found.curve or {}).get("notes", []):
        console.print(f"[yellow]note: {escape(note)}[/yellow]")
    console.print(f"run directory: [bold]{escape(str(run_dir))}[/bold]")
    console.print(
        f"next: vitreg fix {escape(spec)} --neurons {escape(str(run_dir / 'neurons.json'))}"
    )
