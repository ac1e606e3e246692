"""``vitreg fix [SPEC] --neurons FILE|builtin``: test-time registers with a before/after report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from vitreg.cli import options as opt
from vitreg.cli.diagnose_cmd import DEFAULT_SPEC, _command, default_run_dir, slug
from vitreg.cli.neurons_cmd import find_neurons, image_source, load_model, planted_rows
from vitreg.cli.output import cli_errors, console, is_main, join_torchrun
from vitreg.cli.progress import progress
from vitreg.distributed import on_main
from vitreg.errors import InputError
from vitreg.report.fix_report import MAX_ROWS
from vitreg.report.out_dir import check_out


def neuron_file(neurons: str | None) -> Any:
    """The NeuronSet that ``--neurons FILE`` names, read and validated (before any model
    loads); ``None`` for discovery or the built-in set."""
    from vitreg.neurons import NeuronSet

    return None if neurons in (None, "builtin") else NeuronSet.load(neurons)


def load_neurons(
    model: Any, spec: str, neurons: str | None, source: Any, cfg: Any, preloaded: Any = None
) -> tuple[Any, dict[str, Any], Any]:
    """The NeuronSet (file -- ``preloaded`` if read already --, built-in, or discovered first),
    what it is, and the discovery."""
    from vitreg.fix.neuron_set import weights_fingerprint
    from vitreg.neurons import NeuronSet, builtin_neurons
    from vitreg.neurons.auto import layer_counts

    found = None
    if neurons is None:
        console.print(
            "[yellow]No --neurons given: discovering register neurons on these images first "
            "(as `vitreg neurons` does); the fix is then evaluated on the same images.[/yellow]"
        )
        found = find_neurons(model, source, cfg)
        chosen = found.chosen
        origin = (
            "discovered on these images by this run (3 of every 4; the causal check and top-k "
            "on the 4th)"
        )
    elif neurons == "builtin":
        chosen = builtin_neurons(model.spec or spec)
        origin = f"the built-in set for {chosen.model_spec}"
    else:
        chosen = preloaded if preloaded is not None else NeuronSet.load(neurons)
        origin = f"the file {neurons}"
    chosen.check_applicable(model)  # other architecture, bad units or settings, empty: clear error
    matches = None
    if chosen.fingerprint is not None:
        matches = chosen.fingerprint == weights_fingerprint(model.module)
        if not matches:
            console.print(
                f"[yellow]warning: this NeuronSet was made for {escape(str(chosen.model_spec))} "
                f"with other weights than {escape(str(model.spec))} (same shape, different "
                "weight fingerprint); the neurons may not be this model's register neurons.[/yellow]"
            )
    info = {
        "source": origin,
        "model_spec": chosen.model_spec,
        "n_neurons": len(chosen),
        "layers": layer_counts(chosen),
        "fingerprint": chosen.fingerprint,
        "fingerprint_matches": matches,
        "settings": chosen.settings,
    }
    return chosen, info, found


def save_args(model: Any, spec: str, img_size: int | None) -> dict[str, Any]:
    """Constructor arguments that rebuild this timm model (planted: its ground truth's)."""
    truth = getattr(model.module, "vitreg_planted", None)
    if truth is not None:
        return dict(truth.model_args)
    args: dict[str, Any] = {}
    if spec.startswith("local:"):
        config = Path(spec.removeprefix("local:")).expanduser() / "config.json"
        args.update(json.loads(config.read_text()).get("model_args", {}))
    if img_size:
        args["img_size"] = img_size
    return args


def _two_passes(update: Callable[[int], None], total: int) -> Callable[[int], None]:
    """compare_fix counts images from 0 twice (without, then with the fix): one bar over both."""
    state = {"offset": 0, "last": 0}

    def both(n: int) -> None:
        if n <= state["last"]:
            state["offset"] += total
        state["last"] = n
        update(state["offset"] + n)

    return both


def fix_command(
    ctx: typer.Context,
    spec: str | None = opt.SPEC,
    neurons: str | None = typer.Option(
        None,
        "--neurons",
        help="NeuronSet file (neurons.json from `vitreg neurons`) or 'builtin' (the published "
        "set for SPEC); default: discover them first on these images.",
    ),
    images: Path | None = opt.IMAGES,
    samples: bool = opt.SAMPLES,
    out: Path | None = opt.out_dir("fix"),
    save: Path | None = typer.Option(
        None, "--save", help="Also save the fixed model here (timm models; load it as local:DIR)."
    ),
    registers: int = typer.Option(1, "--registers", min=1, help="Test-time registers to insert."),
    cls: str = typer.Option("zero", "--cls", help="Register neurons on [CLS]: zero or keep."),
    patches: str = typer.Option(
        "zero", "--patches", help="Register neurons on patches: zero, mean or keep."
    ),
    mode: str = typer.Option(
        "paper",
        "--mode",
        help="paper (per-neuron max, Algorithm 2) or reference (the official code's edit).",
    ),
    target: float = typer.Option(
        0.01, "--target", min=0.0, max=1.0, help="Outlier rate for top-k when discovering first."
    ),
    limit: int | None = opt.LIMIT,
    batch_size: int = opt.BATCH_SIZE,
    img_size: int | None = opt.IMG_SIZE,
    random_init: bool = opt.RANDOM_INIT,
    weights: Path | None = opt.WEIGHTS,
    device: str | None = opt.DEVICE,
    figure_format: str | None = opt.FIGURE_FORMAT,
    config: Path | None = opt.CONFIG,
    overwrite: bool = opt.OVERWRITE,
) -> None:
    """Apply test-time registers and report before/after: norm maps, outlier rate, embeddings."""
    from vitreg.configs import FixConfig

    with cli_errors():
        cfg = opt.resolve_config(ctx, FixConfig, config, dict(locals()))
    run_fix_command(cfg)


def run_fix_command(cfg: Any) -> None:
    """The fix verb on a typed :class:`~vitreg.configs.FixConfig`."""
    spec, neurons, save, batch_size = cfg.spec, cfg.neurons, cfg.save, cfg.batch_size
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
        "batch_size": batch_size,
    }
    fix_opts = {
        "registers": cfg.registers,
        "cls": cfg.cls,
        "patches": cfg.patches,
        "mode": cfg.mode,
    }
    with cli_errors():
        run_dir = cfg.out if cfg.out is not None else default_run_dir(slug(spec), verb="fix")
        check_out(run_dir, "fix", spec, cfg.overwrite)  # before any model loads
        cfg = cfg.model_copy(update={"spec": spec, "out": run_dir})
        command = _command(spec, {k: v for k, v in cfg.model_dump().items() if k != "spec"}, "fix")
        preloaded = neuron_file(neurons)  # a missing or bad file fails before the model loads
        if cfg.images is not None:
            from vitreg.data.folder import list_images

            list_images(cfg.images)
        device = join_torchrun(cfg.device)
        model = load_model(spec, cfg.random_init, cfg.img_size, device, cfg.weights)
        if model.layout.n_extra:
            raise InputError(
                f"{spec} is loaded with test-time registers already applied (a model saved by "
                "`vitreg fix --save`), so there is no 'before' to compare; run `vitreg fix` on "
                f"the original model, or `vitreg diagnose {spec}` to check the fixed one"
            )
        if save is not None and not getattr(model.module, "pretrained_cfg", {}).get("architecture"):
            raise InputError(
                f"--save writes timm checkpoints and {spec} is a {model.adapter.source} model; "
                "drop --save (the report is still written), or use the timm build of this model"
            )
        source = image_source(model, spec, opts, keep=MAX_ROWS)
        chosen, info, found = load_neurons(model, spec, neurons, source, cfg, preloaded)
        result = run_fix(model, chosen, source, fix_opts, batch_size)
        results = {
            "neurons": info,
            "discovery": found.results() if found is not None else None,
            "saved": None,
            "planted": planted_rows(model, chosen.pairs()),
        }
        if save is not None:
            from vitreg.fix.saved import save_fixed

            if is_main():
                with progress(None, f"saving the fixed model to {save}"):
                    save_fixed(model, result[0], save, **save_args(model, spec, cfg.img_size))
            results["saved"] = str(save)
        on_main(write, run_dir, model, source, result[1], results, cfg.to_file(), command)
    show(result[1], run_dir, save)


def run_fix(
    model: Any, neurons: Any, source: Any, fix_opts: dict[str, Any], batch_size: int
) -> tuple[Any, Any]:
    """The TestTimeRegisters and its before/after comparison on ``source``."""
    from vitreg.fix import TestTimeRegisters, compare_fix

    ttr = TestTimeRegisters(
        neurons,
        n_registers=fix_opts["registers"],
        cls=fix_opts["cls"],
        patches=fix_opts["patches"],
        mode=fix_opts["mode"],
    )
    with progress(2 * source.total, "images without, then with the fix") as update:
        comparison = compare_fix(
            model, ttr, source, batch_size=batch_size, progress=_two_passes(update, source.total)
        )
    return ttr, comparison


def write(
    run_dir: Path,
    model: Any,
    source: Any,
    comparison: Any,
    results: dict[str, Any],
    config: dict[str, Any],
    command: str,
) -> None:
    """The report, config.yaml and metrics.json (last) of one fix."""
    from vitreg.report.fix_report import write_fix_run

    with progress(None, "writing the report"):
        write_fix_run(
            run_dir,
            comparison,
            described=model.describe(),
            data=source.description(),
            config=config,
            results=results,
            command=command,
            images=source.display_images(),
        )


def show(comparison: Any, run_dir: Path, save: Path | None) -> None:
    """The console summary: the verdict per block first, then the detection layer's numbers."""
    from vitreg.report.fix_report import blocks_text

    c = comparison.to_dict()
    res = c["residual"]
    layer = c["detect_layer"]
    table = Table(title="vitreg fix")
    for column in ("", "before", "after"):
        table.add_column(column, style="bold" if not column else None)
    table.add_row(
        "verdict", "artifacts" if res["blocks_with_mode_before"] else "no artifacts", res["verdict"]
    )
    table.add_row(
        "blocks with an outlier mode",
        blocks_text(res["blocks_with_mode_before"]),
        blocks_text(res["blocks_with_mode_after"]),
    )
    ordinary = res["ordinary_max_over_median"]
    table.add_row(
        f"max/median patch norm (block {layer})",
        f"{res['max_over_median_before'][layer]:.3g}",
        f"{res['max_over_median_after'][layer]:.3g}"
        + (f" (ordinary {ordinary:.3g})" if ordinary is not None else ""),
    )
    table.add_row(
        f"patch outlier rate (block {layer})",
        f"{c['outlier_rate_before']:.2%}",
        f"{c['outlier_rate_after']:.2%}",
    )
    table.add_row(
        f"max patch norm (block {layer})",
        f"{c['max_patch_norm_before'][layer]:.4g}",
        f"{c['max_patch_norm_after'][layer]:.4g}",
    )
    table.add_row("register norm", "-", f"{c['register_norm_after'][layer]:.4g}")
    cos = c["pooled_cosine"]
    if cos is not None:
        table.add_row("pooled embedding cosine", "", f"{cos['mean']:.4f} (min {cos['min']:.4f})")
    console.print(table)
    console.print(f"run directory: [bold]{escape(str(run_dir))}[/bold]")
    if save is not None:
        console.print(
            f"fixed model: {escape(str(save))} (load it with vitreg.load('local:{escape(str(save))}'))"
        )
