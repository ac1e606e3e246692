"""``vitreg diagnose [SPEC]``: every artifact analysis in one pass, written to a run directory."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.inspect_cmd import _load
from vitreg.cli.inspect_cmd import move as _move
from vitreg.cli.options import DEFAULT_SPEC
from vitreg.cli.output import (
    cli_errors,
    console,
    err_console,
    fail,
    is_main,
    join_torchrun,
    random_init_banner,
)
from vitreg.cli.progress import progress
from vitreg.errors import InputError, VitregError
from vitreg.report.out_dir import check_out

DEFAULT_SYNTHETIC = 16  # images in the embedded demo (and for planted models without --images)


def _report() -> tuple[Callable[..., Path], Callable[..., tuple[str, list[dict]]]]:
    """The report layer's ``write_run`` and ``compare_table`` (imported when first needed)."""
    from vitreg.report.run import compare_table, write_run

    return write_run, compare_table


def slug(spec: str) -> str:
    """A file-name-safe form of a model spec: ``planted:dinov2_s14`` -> ``planted-dinov2_s14``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-.").lower() or "model"


def default_run_dir(name: str, root: Path = Path("runs"), verb: str = "diagnose") -> Path:
    """``runs/<timestamp>_<name>_<verb>``, with a numeric suffix if that exists already."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{stamp}_{name}_{verb}"
    path, i = base, 1
    while path.exists():
        i += 1
        path = base.with_name(f"{base.name}-{i}")
    return path


def _sources(
    model: Any, spec: str, images: Path | None, samples: bool, limit: int | None, opts: dict
) -> Any:
    """The image source for one model: the folder, the sample photos, or synthetic images."""
    from vitreg.data import images as data

    common = {"batch_size": opts["batch_size"], "keep": opts["max_maps"]}
    if images is not None:
        return data.folder_images(model, images, limit=limit, **common)
    if samples:
        return data.sample_images(model, limit=limit, **common)
    if spec.startswith("planted:"):
        return data.synthetic_images(model, n=limit or DEFAULT_SYNTHETIC, **common)
    try:
        return data.sample_images(model, limit=limit, **common)
    except VitregError as e:
        raise InputError(
            f"{spec} is not a planted model, so it needs real images and none were given: pass "
            "--images DIR (a folder of .jpg/.png files), or use the bundled photos with --samples "
            f"after `pip install 'vitreg[samples]'` ({e})"
        ) from None


def run_one(
    spec: str, out_dir: Path, opts: dict[str, Any], command: str, config: dict[str, Any]
) -> Any:
    """Load ``spec``, diagnose it on the chosen images, write its run directory (``config``: its
    typed config, as config.yaml); the result."""
    from vitreg.analysis.diagnose import diagnose
    from vitreg.distributed import barrier

    with progress(None, f"loading {spec}"):
        model = _load(spec, not opts["random_init"], opts["weights"], opts["img_size"])
    model = _move(model, opts["device"])
    source = _sources(model, spec, opts["images"], opts["samples"], opts["limit"], opts)
    for note in model.notes:
        console.print(f"[yellow]note: {escape(note)}[/yellow]")
    if opts["random_init"]:
        random_init_banner(spec)
    colour = "yellow" if source.synthetic else "cyan"
    console.print(f"[{colour}]images: up to {source.total} from {escape(source.label)}[/{colour}]")
    with progress(source.total, f"diagnosing {spec}") as update:
        result = diagnose(
            model,
            source,
            batch_size=opts["batch_size"],
            limit=opts["limit"],
            max_maps=opts["max_maps"],
            progress=update,
        )
    result.data.update(source.description())
    write_run, _ = _report()
    if is_main():  # under torchrun every rank has the result; rank 0 writes it
        with progress(None, "writing the report"):
            shown = source.display_images()
            write_run(
                out_dir,
                result,
                images=shown,
                config=config,
                command=command,
                max_maps=opts["max_maps"],
            )
    barrier()
    return result


def _layer_shown(norms: Any) -> int:
    """The layer the summary reports: the strongest outlier layer, or the last block."""
    strongest = norms.report.evidence.get("strongest_layer")
    return strongest if strongest is not None else len(norms.report.layers) - 1


def _agreement(result: Any, site: str) -> str:
    """IoU of attention artifacts and norm outliers at block output ``site``, and the best layer."""
    attn = result.results.get("attention")
    if attn is None:
        return "n/a (" + result.not_applicable.get("attention", "not run") + ")"
    scored = [(a["iou"], layer) for a, layer in zip(attn.agreement, attn.layers, strict=True)]
    scored = [(iou, layer) for iou, layer in scored if iou is not None]
    entry = next((a for a in attn.agreement if a.get("norm_site") == site), None)
    if entry is None or entry.get("iou") is None or not scored:
        return "n/a"
    best, layer = max(scored, key=lambda x: x[0])
    where = f" at block {layer}" if best > 0 else ""
    return f"{entry['iou']:.2f} (best {best:.2f}{where}; vs {entry['norm_method']} outliers)"


def summary_rows(result: Any) -> dict[str, str]:
    """The console summary of one diagnose result (strings, in column order)."""
    norms = result.results["norms"]
    report = norms.report
    layer = _layer_shown(norms)
    rates = report.layers[layer].rates
    final = report.final_norm
    skipped = len(result.data.get("skipped", {}))
    converted = len(result.data.get("converted", {}))
    return {
        "verdict": "[red]artifacts[/red]" if report.verdict else "[green]no artifacts[/green]",
        "emerges at": "-" if report.emergence_layer is None else f"block {report.emergence_layer}",
        "rates at": f"block {layer}",
        **{f"{m} rate": f"{rate:.1%}" for m, rate in rates.items()},
        "after final norm (auto)": f"{final.rates['auto']:.1%}" if final else "n/a",
        "attention-norm IoU": _agreement(result, report.layers[layer].site),
        "images": f"{result.data.get('n_images', 0)} ({converted} converted, {skipped} skipped)",
    }


def show_summary(labelled: list[tuple[str, Any]]) -> None:
    """One column per model, one row per figure: verdict, emergence layer, rates, agreement."""
    rows = [summary_rows(r) for _, r in labelled]
    table = Table(title="vitreg diagnose")
    table.add_column("", style="bold")
    for label, _ in labelled:
        table.add_column(escape(label), overflow="fold")
    for key in rows[0]:
        table.add_row(key, *(row[key] for row in rows))
    console.print(table)
    console.print(
        "Rates: patch tokens above each rule's threshold on the residual stream at the layer "
        "named; top_p flags p% of tokens in any model, only `auto` (the bimodal split) decides "
        "the verdict."
    )


def _command(spec: str, options: dict[str, Any], verb: str = "diagnose") -> str:
    """The command line that reproduces the run of ``spec`` (options left unset are omitted)."""
    parts = ["vitreg", verb, spec]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif value not in (None, False):
            parts += [flag, str(value)]
    return shlex.join(parts)


def write_comparison(
    parent: Path, labelled: list[tuple[str, Any]], dirs: list[Path], figure_format: str | None
) -> Path:
    """comparison.md, report.html and comparison.json in ``parent`` (the report layer's)."""
    from vitreg.report.compare import write_model_comparison

    return write_model_comparison(parent, labelled, dirs, figure_format)


def diagnose_model(
    ctx: typer.Context,
    spec: str | None = opt.SPEC,
    images: Path | None = opt.IMAGES,
    samples: bool = opt.SAMPLES,
    out: Path | None = opt.out_dir("diagnose"),
    limit: int | None = opt.LIMIT,
    batch_size: int = opt.BATCH_SIZE,
    device: str | None = opt.DEVICE,
    max_maps: int = typer.Option(
        8, "--max-maps", min=1, help="Images whose per-layer maps are kept for figures."
    ),
    random_init: bool = opt.RANDOM_INIT,
    weights: Path | None = opt.WEIGHTS,
    img_size: int | None = opt.IMG_SIZE,
    models: str | None = typer.Option(
        None, "--models", help="Comma-separated specs: diagnose each and compare them."
    ),
    figure_format: str | None = opt.FIGURE_FORMAT,
    config: Path | None = opt.CONFIG,
    overwrite: bool = opt.OVERWRITE,
) -> None:
    """Find token artifacts: norms and outliers by every rule, attention sinks, LN separation."""
    from vitreg.configs import DiagnoseConfig

    with cli_errors():
        cfg = opt.resolve_config(ctx, DiagnoseConfig, config, dict(locals()))
    run_diagnose(cfg)


def run_diagnose(cfg: Any) -> None:
    """The diagnose verb on a typed :class:`~vitreg.configs.DiagnoseConfig`."""
    spec, models, out, images = cfg.spec, cfg.models, cfg.out, cfg.images
    specs = (
        [s.strip() for s in models.split(",") if s.strip()] if models else [spec or DEFAULT_SPEC]
    )
    if models is not None and not specs:
        raise fail(
            "--models needs comma-separated model specs, e.g. --models planted:dinov2_s14,planted:deit3_s16"
        )
    opts = {
        "images": images,
        "samples": cfg.samples,
        "limit": cfg.limit,
        "batch_size": cfg.batch_size,
        "device": cfg.device,
        "max_maps": cfg.max_maps,
        "random_init": cfg.random_init,
        "weights": cfg.weights,
        "img_size": cfg.img_size,
        "figure_format": cfg.figure_format,
    }
    if spec is None and models is None:
        console.print(
            f"[yellow]No model given: running the embedded demo, {DEFAULT_SPEC}, a synthetic "
            "ViT with planted artifacts. Pass a SPEC (see `vitreg models`) for a real model."
            "[/yellow]"
        )
    with cli_errors():
        name = slug(specs[0]) if len(specs) == 1 else f"compare-{len(specs)}-models"
        run_dir = out if out is not None else default_run_dir(name)
        check_out(run_dir, "diagnose", ",".join(specs), cfg.overwrite)  # before any model loads
        opts["device"] = join_torchrun(cfg.device)
        if images is not None:
            from vitreg.data.folder import list_images

            list_images(images)  # an empty or missing folder fails before any model is loaded
        labelled: list[tuple[str, Any]] = []
        dirs: list[Path] = []
        for s in specs:
            target = run_dir if len(specs) == 1 else _unique(run_dir / slug(s), dirs)
            command = _command(s, {**opts, "out": target})
            config = cfg.model_copy(update={"spec": s, "models": None, "out": target}).to_file()
            try:
                labelled.append((s, run_one(s, target, opts, command, config)))
            except KeyboardInterrupt:
                err_console.print(
                    f"[red]interrupted: no metrics.json was written for {escape(s)}[/red]"
                )
                raise typer.Exit(code=130) from None
            dirs.append(target)
        show_summary(labelled)
        if len(specs) > 1 and is_main():
            comparison = write_comparison(run_dir, labelled, dirs, cfg.figure_format)
            console.print(f"comparison: {comparison}")
    for label, d in zip(specs, dirs, strict=True):
        console.print(f"run directory ({escape(label)}): [bold]{escape(str(d))}[/bold]")


def _unique(path: Path, taken: list[Path]) -> Path:
    """``path``, or ``path-2``, ``path-3``... if an earlier model of this run has it."""
    candidate, i = path, 1
    while candidate in taken:
        i += 1
        candidate = path.with_name(f"{path.name}-{i}")
    return candidate
