"""The diagnose verb: every artifact analysis of one model (or several, compared) on the chosen
images, written to a run directory exactly as ``vitreg diagnose`` does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitreg.configs import DiagnoseConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.errors import InputError
from vitreg.progress import SILENT, Progress
from vitreg.results.diagnose import DiagnoseResults
from vitreg.results.schema import Envelope
from vitreg.verbs.common import (
    DEFAULT_SPEC,
    command_line,
    default_run_dir,
    demo_notice,
    join_torchrun,
    slug,
)
from vitreg.verbs.loading import check_images, model_and_images
from vitreg.verbs.result import DiagnoseRun, Interrupted, Listener, Notice, Notices
from vitreg.verbs.resume import checkpointed, finished

if TYPE_CHECKING:
    from vitreg.analysis.diagnose import DiagnoseResult
    from vitreg.models.model import Model


def _writer() -> Callable[..., Envelope | None]:
    """The report layer's diagnose writer (imported when first needed; tests swap it)."""
    from vitreg.report.renderers.diagnose import write_diagnose_run

    return write_diagnose_run


def specs_of(cfg: DiagnoseConfig) -> list[str]:
    """The models a config diagnoses: ``models`` split on commas, else its spec (or the demo)."""
    if cfg.models is None:
        return [cfg.spec or DEFAULT_SPEC]
    specs = [s.strip() for s in cfg.models.split(",") if s.strip()]
    if not specs:
        raise InputError(
            "--models needs comma-separated model specs, e.g. --models "
            "planted:dinov2_s14,planted:deit3_s16"
        )
    return specs


def check_specs(specs: list[str]) -> None:
    """Every spec of ``--models`` resolved before the first model loads: its source known and,
    where that is cheap, its name (a planted model, a timm architecture, a folder that exists),
    so a bad last spec is not found after the first model ran."""
    from vitreg.errors import SpecError
    from vitreg.models.load import parse_spec

    for spec in specs:
        try:
            source, name = parse_spec(spec)
            _check_name(source, name)
        except SpecError as e:
            raise SpecError(f"--models: {e}; no model was loaded") from None


def _check_name(source: str, name: str) -> None:
    """The loader's own refusal of an unknown ``name``, made without building anything."""
    from vitreg.errors import SpecError

    if source == "planted":
        from vitreg.testing.planted.planted import SPECS

        if name not in SPECS:
            raise SpecError(f"unknown planted model {name!r}; known: {sorted(SPECS)}")
    elif source == "timm":
        import timm

        if not timm.is_model(name):
            raise SpecError(f"timm has no model named {name!r}")
    elif source == "local" and not Path(name).expanduser().is_dir():
        raise SpecError(f"local model directory {name!r} does not exist")
    elif source in ("hf", "hf-vlm"):
        from vitreg.models.loaders.hf_source import hub_or_folder

        hub_or_folder(name)


def _options(cfg: DiagnoseConfig, device: str | None) -> dict[str, Any]:
    """The settings the reproducing command line shows, in the order it has always had."""
    names = ("images", "samples", "limit", "batch_size", "device", "max_maps", "random_init")
    names += ("weights", "img_size", "figure_format", "sink_control", "compile")
    return {**{k: getattr(cfg, k) for k in names}, "device": device}


@contextmanager
def compiled_forward(model: Model, on: bool, notices: Notices) -> Iterator[None]:
    """Inside, ``model``'s traced forward is compiled when ``on``; what compiling did (graphs,
    fallbacks and their reasons) is said in a notice at the end."""
    if not on:
        yield
        return
    with model.compile() as compiled:
        yield
    report = compiled.report
    notices.append(Notice("model", report.summary(), caution=report.fallbacks > 0))


def diagnose_one(
    cfg: DiagnoseConfig,
    spec: str,
    out_dir: Path,
    device: str | None,
    progress: Progress,
    notices: Notices,
) -> tuple[DiagnoseResult, Envelope | None]:
    """Load ``spec``, diagnose it on the chosen images, write its run directory; the result and
    the typed metrics.json document written (None on another torchrun rank, which writes nothing)."""
    from vitreg.analysis.diagnose import diagnose
    from vitreg.distributed import barrier, is_main

    one = cfg.model_copy(update={"spec": spec})
    model, source = model_and_images(one, device, progress, notices, cfg.max_maps)
    every = cfg.checkpoint_every
    with (
        compiled_forward(model, cfg.compile, notices),
        checkpointed(out_dir, every, one.to_file()),
        progress(source.total, f"diagnosing {spec} (images)") as update,
    ):
        result = diagnose(
            model,
            source,
            batch_size=cfg.batch_size,
            limit=cfg.limit,
            max_maps=cfg.max_maps,
            progress=update,
            sink_control=cfg.sink_control,
        )
    result.data = source.description()
    write_run = _writer()
    document = None
    if is_main():  # under torchrun every rank has the result; rank 0 writes it
        with progress(None, "writing the report"):
            document = write_run(
                out_dir,
                result,
                images=source.display_images(),
                config=cfg.model_copy(update={"spec": spec, "models": None, "out": out_dir}),
                command=command_line(spec, {**_options(cfg, device), "out": out_dir}),
                max_maps=cfg.max_maps,
            )
    barrier()
    finished(out_dir, every)
    return result, document


@session()  # the --out claimed inside is released when the verb ends
def run_diagnose(
    cfg: DiagnoseConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> DiagnoseRun:
    """Diagnose the model(s) of ``cfg`` and write the run directory (with several models, one
    sub-directory each plus comparison.md, report.html and comparison.json)."""
    from vitreg.core.out_dir import check_out
    from vitreg.distributed import is_main
    from vitreg.report.writer import as_json

    notices = Notices(on_notice)
    if cfg.spec is None and cfg.models is None:
        notices.append(demo_notice("planted artifacts"))
    specs = specs_of(cfg)
    if cfg.models is not None:
        check_specs(specs)
    cfg = same_images(cfg, specs, notices)
    name = slug(specs[0]) if len(specs) == 1 else f"compare-{len(specs)}-models"
    run_dir = cfg.out if cfg.out is not None else default_run_dir(name)
    check_out(run_dir, "diagnose", ",".join(specs), cfg.overwrite)  # before any model loads
    device = join_torchrun(cfg.device)
    check_images(cfg.images)
    labelled: list[tuple[str, DiagnoseResult]] = []
    dirs: list[Path] = []
    documents: list[Envelope | None] = []
    for spec in specs:
        target = run_dir if len(specs) == 1 else _unique(run_dir / slug(spec), dirs)
        try:
            result, document = diagnose_one(cfg, spec, target, device, progress, notices)
        except KeyboardInterrupt:
            saved = target / "metrics.json"  # check_out left no earlier one
            raise Interrupted(spec, saved if saved.is_file() else None) from None
        labelled.append((spec, result))
        documents.append(document)
        dirs.append(target)
    written = [as_json(d) for d in documents if d is not None]
    comparison, document = None, written[0] if len(specs) == 1 and written else None
    if len(specs) > 1 and is_main():
        from vitreg.report.compare import write_model_comparison
        from vitreg.report.writer import MODELS
        from vitreg.results.schema import RunDocument

        whole = cfg.model_copy(update={"out": run_dir})
        options = {**_options(cfg, device), "models": cfg.models, "out": run_dir}
        merged = write_model_comparison(
            run_dir,
            labelled,
            dirs,
            [RunDocument.model_validate(d) for d in written],
            config=whole.to_file(),
            command=command_line(None, options),
        )
        document = merged.model_dump(mode="json")
        comparison = run_dir / MODELS.markdown
    return DiagnoseRun(
        "diagnose",
        run_dir,
        document,
        notices.items,
        labelled=labelled,
        run_dirs=dirs,
        comparison=comparison,
    )


def same_images(cfg: DiagnoseConfig, specs: list[str], notices: Notices) -> DiagnoseConfig:
    """``cfg`` with every model on the same images: several models, none given, and not all of
    them planted (which would each default to their own images: synthetic ones for planted
    models, the sample photos for the others) run on the sample photos, said in a notice."""
    planted = [s.startswith("planted:") for s in specs]
    if len(specs) == 1 or cfg.images is not None or cfg.samples or all(planted):
        return cfg
    notices.append(
        Notice(
            "images",
            "--models mixes planted and real models: every model runs on the bundled sample "
            "photos (as --samples), so that the comparison is on the same images",
            caution=True,
        )
    )
    return cfg.model_copy(update={"samples": True})


def _unique(path: Path, taken: list[Path]) -> Path:
    """``path``, or ``path-2``, ``path-3``... if an earlier model of this run has it."""
    candidate, i = path, 1
    while candidate in taken:
        i += 1
        candidate = path.with_name(f"{path.name}-{i}")
    return candidate


VERB = register(
    Verb(
        config=DiagnoseConfig,
        run=run_diagnose,
        help="Find token artifacts: norms and outliers by every rule, attention sinks, LN separation.",
        results=DiagnoseResults,
        renderer="vitreg.report.renderers.diagnose",
        argument=("spec",),
    )
)
