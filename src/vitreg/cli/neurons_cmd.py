"""``vitreg neurons [SPEC]``: find register neurons, calibrate top-k on held-out images, save them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.diagnose_cmd import (
    DEFAULT_SPEC,
    _command,
    _move,
    _sources,
    default_run_dir,
    slug,
)
from vitreg.cli.inspect_cmd import _load
from vitreg.cli.output import cli_errors, console, join_torchrun, random_init_banner
from vitreg.cli.progress import progress
from vitreg.distributed import on_main
from vitreg.report.out_dir import check_out


def load_model(
    spec: str,
    random_init: bool,
    img_size: int | None,
    device: str | None,
    weights: Path | None = None,
) -> Any:
    """Load ``spec`` (from ``weights`` if given; a progress line while it builds) and move it to
    ``device``."""
    with progress(None, f"loading {spec}"):
        model = _load(spec, not random_init, weights, img_size)
    model = _move(model, device)
    for note in model.notes:
        console.print(f"[yellow]note: {escape(note)}[/yellow]")
    if random_init:
        random_init_banner(spec)
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
    cfg: Any,
) -> Any:
    """The library's automatic path on ``source`` with the search settings of ``cfg`` (a
    :class:`~vitreg.configs.NeuronSearch`), with progress bars and the split announced as
    metrics.json records it (images used, after skips and the held-out cap)."""
    from vitreg.neurons.auto import SPLIT_RULE, find_neurons

    found = find_neurons(
        model,
        source,
        n_images=source.total,
        top_k=None if cfg.top_k == "auto" else cfg.top_k,
        target=cfg.target,
        batch_size=cfg.batch_size,
        detect_layer=cfg.detect_layer,
        highest_layer=cfg.highest_layer,
        threshold=cfg.threshold,
        progress=progress,
    )
    split = found.split
    console.print(
        f"split: {split['n_discovery']} images for discovery, {split['n_held_out']} held out "
        f"({SPLIT_RULE})"
    )
    return found


def planted_rows(model: Any, pairs: list[tuple[int, int]]) -> list[dict[str, Any]] | None:
    """A planted fixture's units with their role and whether ``pairs`` includes them."""
    truth = getattr(model.module, "vitreg_planted", None)
    if truth is None:
        return None
    roles = [(*u, "cause (writes the outliers)") for u in truth.causal_units]
    roles += [(*u, "reader (fires on outliers)") for u in truth.reader_units]
    roles += [(lay, u, f"distractor ({kind})") for lay, u, kind in truth.distractor_units]
    chosen = set(pairs)
    return [
        {"layer": lay, "unit": u, "role": role, "chosen": (lay, u) in chosen}
        for lay, u, role in roles
    ]


def neurons_command(
    ctx: typer.Context,
    spec: str | None = opt.SPEC,
    images: Path | None = opt.IMAGES,
    samples: bool = opt.SAMPLES,
    top_k: str = typer.Option(
        "auto",
        "--top-k",
        help="'auto': the causal units, the smallest k whose fix leaves no artifacts on held-out "
        "images; or a number of neurons (the paper's top-k ranking).",
    ),
    target: float = typer.Option(
        0.01,
        "--target",
        min=0.0,
        max=1.0,
        help="Held-out patch outlier rate the fix must also reach (besides no outlier mode).",
    ),
    out: Path | None = opt.out_dir("neurons"),
    limit: int | None = opt.LIMIT,
    batch_size: int = opt.BATCH_SIZE,
    img_size: int | None = opt.IMG_SIZE,
    random_init: bool = opt.RANDOM_INIT,
    weights: Path | None = opt.WEIGHTS,
    detect_layer: int | None = typer.Option(
        None,
        "--detect-layer",
        help="Block whose output defines outliers (default: the cleanest outlier mode).",
    ),
    highest_layer: int | None = typer.Option(
        None,
        "--highest-layer",
        help="Last block searched for neurons (default: where the outliers emerge).",
    ),
    threshold: str = typer.Option(
        "auto",
        "--threshold",
        help="Outlier rule: auto (valley of the norm histogram), mean3std, robust, or a norm.",
    ),
    device: str | None = opt.DEVICE,
    figure_format: str | None = opt.FIGURE_FORMAT,
    config: Path | None = opt.CONFIG,
    overwrite: bool = opt.OVERWRITE,
) -> None:
    """Find register neurons: discovery, a causal check and the fix checked on held-out images."""
    from vitreg.configs import NeuronsConfig

    with cli_errors():
        cfg = opt.resolve_config(ctx, NeuronsConfig, config, dict(locals()))
    run_neurons(cfg)


def run_neurons(cfg: Any) -> None:
    """The neurons verb on a typed :class:`~vitreg.configs.NeuronsConfig`."""
    spec = cfg.spec
    if spec is None:
        console.print(
            f"[yellow]No model given: running the embedded demo, {DEFAULT_SPEC}, a synthetic "
            "ViT with planted register neurons, on synthetic images. Pass a SPEC (see `vitreg "
            "models`) for a real model.[/yellow]"
        )
    spec = spec or DEFAULT_SPEC
    opts = {
        "images": cfg.images,
        "samples": cfg.samples,
        "limit": cfg.limit,
        "batch_size": cfg.batch_size,
    }
    with cli_errors():
        run_dir = cfg.out if cfg.out is not None else default_run_dir(slug(spec), verb="neurons")
        check_out(run_dir, "neurons", spec, cfg.overwrite)  # before any model loads
        cfg = cfg.model_copy(update={"spec": spec, "out": run_dir})
        command = _command(
            spec, {k: v for k, v in cfg.model_dump().items() if k != "spec"}, "neurons"
        )
        if cfg.images is not None:
            from vitreg.data.folder import list_images

            list_images(cfg.images)  # an empty or missing folder fails before the model loads
        device = join_torchrun(cfg.device)
        model = load_model(spec, cfg.random_init, cfg.img_size, device, cfg.weights)
        source = image_source(model, spec, opts)
        found = find_neurons(model, source, cfg)
        on_main(write, run_dir, model, source, found, cfg.to_file(), command)
    show(found, spec, run_dir)


def write(
    run_dir: Path,
    model: Any,
    source: Any,
    found: Any,
    config: dict[str, Any],
    command: str,
) -> None:
    """The NeuronSet files, then the report (metrics.json last)."""
    from vitreg.report.fix_report import write_neurons_run

    data = {**source.description(), "split": found.split}
    found.chosen.data = {**found.chosen.data, "images": source.label, "split": found.split}
    with progress(None, "writing the neuron set and the report"):
        (run_dir / "metrics.json").unlink(missing_ok=True)  # never beside a newer neuron set
        found.chosen.save(run_dir / "neurons")
        results = found.results()
        results["planted"] = planted_rows(model, found.chosen.pairs())
        results["files"] = {"json": "neurons.json", "tensors": "neurons.safetensors"}
        write_neurons_run(
            run_dir,
            described=model.describe(),
            data=data,
            config=config,
            results=results,
            command=command,
        )


def show(found: Any, spec: str, run_dir: Path) -> None:
    """The console summary: the verdict after the fix first, then what was chosen and why."""
    held = found.held_out
    s = found.ranking.settings
    table = Table(title="vitreg neurons", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    left = held["blocks_with_outlier_mode_after"]
    verdict = (
        "no artifacts after the fix (no outlier mode at any block)"
        if found.status == "clean"
        else f"PARTIAL: outlier mode still at blocks {left}"
        if left
        else "PARTIAL: max/median patch norm still above the ordinary level"
    )
    layers = ", ".join(f"{r['layer']} ({r['n_neurons']})" for r in found.results()["layers"])
    how = "causal selection + calibration" if found.causal is not None else f"top-k {found.mode}"
    rows = {
        "held-out verdict": verdict,
        "max/median patch norm": f"{held['max_over_median_before']:.3g} -> "
        f"{held['max_over_median_after']:.3g} (ordinary patches: "
        f"{held['ordinary_max_over_median']:.3g})",
        "neurons": f"{len(found.chosen)} ({how})",
        "layers (count)": layers,
        "searched": found.detection.reasons["highest_layer"],
        "detection": f"block {s['detect_layer']}, {s['threshold']} threshold",
        "held-out outlier rate": f"{held['outlier_rate_before']:.2%} -> "
        f"{held['outlier_rate_after']:.2%} ({held['n_images']} images)",
    }
    for key, value in rows.items():
        table.add_row(key, escape(value))
    console.print(table)
    for note in found.curve.notes:
        console.print(f"[yellow]note: {escape(note)}[/yellow]")
    console.print(f"run directory: [bold]{escape(str(run_dir))}[/bold]")
    console.print(
        f"next: vitreg fix {escape(spec)} --neurons {escape(str(run_dir / 'neurons.json'))}"
    )
