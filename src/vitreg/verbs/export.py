"""The export verb: a model's activations at the chosen sites, every token labelled, written as
safetensors shards with an index (plus parquet tables and zarr grids on request) and a run
report, as ``vitreg export`` does; a rerun into the same folder resumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vitreg.configs import ExportConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.errors import InputError
from vitreg.progress import SILENT, Progress
from vitreg.results.export import ExportIndex, ExportResults, ExportSettings, LayerSummary
from vitreg.results.schema import model_info
from vitreg.verbs.common import images_named, join_torchrun, prepare
from vitreg.verbs.loading import check_images, model_and_images
from vitreg.verbs.result import Listener, Notices, VerbResult

if TYPE_CHECKING:
    from vitreg.export.run import Names, Plan
    from vitreg.fix.base import Fix

DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


@dataclass
class ExportRun(VerbResult):
    """``results``: what was written (the metrics.json block); ``index`` the export's index."""

    results: ExportResults | None = None
    index: ExportIndex | None = None


def image_names(source: Any) -> Names:
    """``names(start, n)``: the file names of the source's images ``start..start+n`` (a folder's
    or shards' files as listed while reading; the sample photos' names; else numbered)."""
    described = source.description().model_dump()
    listed, kind = described.get("names"), described.get("source", "image")

    def names(start: int, n: int) -> list[str]:
        used = source.log.used if source.log is not None else []
        if len(used) >= start + n:
            return [str(u) for u in used[start : start + n]]
        if isinstance(listed, list) and len(listed) >= start + n:
            return [str(u) for u in listed[start : start + n]]
        return [f"{kind}-{i:06d}" for i in range(start, start + n)]

    return names


def summarise(
    index: ExportIndex, cfg: ExportConfig, seconds: float, resumed: list[str]
) -> ExportResults:
    """The results block from the finished index (rates: of the shards this run wrote)."""
    lay = index.layout
    n = index.n_images
    layers = []
    for key, site in zip(index.settings.layers, index.settings.sites, strict=True):
        rule = index.outlier_rules[key]
        outliers = sum(s.outliers.get(key, 0) for s in index.shards)
        patches = n * lay.grid[0] * lay.grid[1] if "patches" in cfg.tokens else 0
        excluded = {
            r: sum(sum(s.excluded.get(key, {}).get(r, [])) for s in index.shards)
            for r in cfg.exclude
        }
        layers.append(
            LayerSummary(
                layer=key,
                site=site,
                rows=sum(s.rows.get(key, 0) for s in index.shards),
                outliers=outliers,
                outlier_rate=outliers / patches if patches else 0.0,
                outlier_cut=rule.cut,
                sink_events_per_image=sum(s.sink_keys.get(key, 0) for s in index.shards)
                / max(n, 1),
                excluded=excluded,
                lof_tokens=sum(s.lof.get(key, 0) for s in index.shards)
                if index.settings.lof
                else None,
            )
        )
    new = [s for s in index.shards if s.file not in resumed]
    written, exported = sum(s.bytes for s in new), sum(s.n_images for s in new)
    return ExportResults(
        n_images=n,
        n_shards=len(index.shards),
        shard_size=cfg.shard_size,
        site=cfg.site,
        tokens=cfg.tokens,
        dtype=cfg.dtype,
        fix=cfg.fix,
        formats=cfg.formats,
        layers=layers,
        bytes_written=written,
        seconds=seconds,
        images_per_second=exported / seconds if seconds > 0 else 0.0,
        write_mb_per_s=written / 1e6 / seconds if seconds > 0 else 0.0,
        resumed_shards=len(resumed),
    )


def build_fix(
    model: Any, cfg: ExportConfig, source: Any, progress: Progress, notices: Notices
) -> Fix:
    """The fix ``cfg.fix`` names, built for ``model`` (its neurons read or discovered)."""
    from vitreg.fix.methods import FIXES, FixInputs
    from vitreg.verbs.neuron_sources import load_neurons

    neurons = None
    if any(m.needs_neurons for m in FIXES.parts(cfg.fix)):
        neurons, _, _ = load_neurons(model, cfg.spec, cfg.neurons, source, cfg, progress, notices)
    inputs = FixInputs(model, neurons, source, cfg.batch_size, cfg.ttr_args())
    return FIXES.build(cfg.fix, inputs)


def plan_of(cfg: ExportConfig, model: Any) -> Plan:
    """The export plan of ``cfg`` for ``model``: every choice checked against the model."""
    import torch

    from vitreg.export import Plan
    from vitreg.export.sites import check_sites, plan_layers, token_kinds

    layers = plan_layers(cfg.site, cfg.layers, model.n_layers)
    check_sites(layers, model.hook_names(), model.adapter.source)
    if "sinks" in cfg.exclude and all(layer.pattern_site is None for layer in layers):
        raise InputError("--exclude sinks needs attention heads after the site; ln_final has none")
    if "sinks" in cfg.exclude and not any(
        n.endswith("attn.hook_pattern") for n in model.hook_names()
    ):
        raise InputError(f"--exclude sinks: {cfg.spec} has no attention pattern sites")
    return Plan(
        layers,
        token_kinds(cfg.tokens),
        cfg.exclude,
        getattr(torch, DTYPES[cfg.dtype]),
        cfg.shard_size,
        cfg.formats,
        cfg.batch_size,
        cfg.lof,
    )


def settings_of(cfg: ExportConfig, model: Any, plan: Plan, fix: Fix | None) -> ExportSettings:
    """What decides the exported numbers (a resume must match them)."""
    from vitreg.fix.base import fix_description
    from vitreg.fix.neuron_set import weights_fingerprint

    return ExportSettings(
        spec=cfg.spec,
        weights=weights_fingerprint(model.module),
        sites=[layer.site for layer in plan.layers],
        layers=[layer.key for layer in plan.layers],
        tokens=cfg.tokens,
        fix=cfg.fix,
        fix_description=None if fix is None else fix_description(fix).model_dump_json(),
        dtype=cfg.dtype,
        shard_size=cfg.shard_size,
        exclude=cfg.exclude,
        calibration=cfg.calibration,
        lof=cfg.lof,
        formats=cfg.formats,
        images=images_named(cfg),
        limit=cfg.limit,
        img_size=cfg.img_size,
    )


def known_depth(spec: str) -> int | None:
    """The block count of a ``planted:`` or ``timm:`` spec, from its architecture built on the
    meta device (no weights, no memory); ``None`` for other sources (checked once loaded)."""
    import timm
    import torch

    from vitreg.models.load import parse_spec

    source, name = parse_spec(spec)
    if source == "planted":
        from vitreg.testing.planted.planted import SPECS

        if name not in SPECS:
            return None
        arch, args = SPECS[name].architecture, dict(SPECS[name].args)
    elif source == "timm" and timm.is_model(name.partition(".")[0]):
        arch, args = name.partition(".")[0], {}
    else:
        return None
    with torch.device("meta"):
        blocks = getattr(timm.create_model(arch, pretrained=False, **args), "blocks", None)
    return len(blocks) if blocks is not None else None


def check_layers(cfg: ExportConfig) -> None:
    """``--layers`` within the model, checked before it loads where its depth is known."""
    from vitreg.export.sites import plan_layers

    if "saev" in cfg.formats and cfg.site == "ln_final":
        raise InputError("--formats saev keys its shards by block number; ln_final has none")
    depth = known_depth(cfg.spec) if cfg.layers else None
    if depth is not None:
        plan_layers(cfg.site, cfg.layers, depth)


@session()  # the --out claimed inside is released when the verb ends
def run_export(
    cfg: ExportConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> ExportRun:
    """Export ``cfg``'s model's activations on its images into the run directory."""
    from contextlib import nullcontext

    from vitreg.distributed import is_main
    from vitreg.export import export
    from vitreg.export.formats import check_formats
    from vitreg.report.renderers.export import write_export_run
    from vitreg.report.writer import as_json

    notices = Notices(on_notice)
    check_formats(cfg.formats)
    cfg, command = prepare(cfg, notices, demo=f"planted register neurons, on {images_named(cfg)}")
    check_layers(cfg)
    check_images(cfg.images)
    device = join_torchrun(cfg.device)
    model, source = model_and_images(cfg, device, progress, notices)
    plan = plan_of(cfg, model)
    fix = None if cfg.fix == "none" else build_fix(model, cfg, source, progress, notices)
    settings = settings_of(cfg, model, plan, fix)
    with (
        fix.applied(model) if fix is not None else nullcontext(),
        progress(source.total, "exporting (images)") as update,
    ):
        written = export(cfg.out, model, source, image_names(source), plan, settings, update)
    results = summarise(written.index, cfg, written.seconds, written.resumed)
    document = None
    if is_main():
        with progress(None, "writing the report"):
            document = write_export_run(
                cfg.out, results, model_info(model.describe()), source.description(), cfg, command
            )
    written_doc = None if document is None else as_json(document)
    return ExportRun(
        "export", cfg.out, written_doc, notices.items, results=results, index=written.index
    )


VERB = register(
    Verb(
        config=ExportConfig,
        run=run_export,
        help="""Export a model's activations at chosen sites, every token labelled (kind, grid
    cell, norm, outlier and sink flags), as safetensors shards with an index, parquet tables and
    zarr patch grids; a rerun into the same folder resumes.""",
        results=ExportResults,
        renderer="vitreg.report.renderers.export",
        resumes=True,
        argument=("spec",),
    )
)
