"""The probe verb: probes of one model, bare and/or with a fix (test-time registers or any
method of :data:`vitreg.fix.methods.FIXES`), written to a run directory as ``vitreg probe``
does."""

from __future__ import annotations

from typing import Any

from vitreg.configs import NeuronsConfig, NeuronSource, ProbeRunConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.results.probe import ProbeResults
from vitreg.results.schema import model_info
from vitreg.verbs.common import join_torchrun, prepare
from vitreg.verbs.loading import image_source, load_model
from vitreg.verbs.neuron_sources import load_neurons, neuron_file
from vitreg.verbs.result import Listener, Notices, ProbeRun


def parse_layers(text: str) -> list[int | str]:
    """``-1,0,final`` -> ``[-1, 0, "final"]`` (hook names pass through; the config checks that
    at least one is named)."""
    out: list[int | str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            out.append(part)
    return out


def fix_plan(fix: str, neurons: NeuronSource) -> tuple[bool, NeuronSource | None, bool]:
    """(run base?, neuron source, run fixed?) from ``fix`` none|both|METHOD|SOURCE (the config
    has checked ``fix`` and that ``neurons`` goes with ``fix both`` or a method only); a method
    runs bare and fixed, with ``neurons`` when one of its parts edits register neurons."""
    from vitreg.fix.methods import FIXES, is_entry

    if fix == "none":
        return True, None, False
    if fix == "both":
        return True, neurons, True
    if is_entry(fix):
        edits = any(m.needs_neurons for m in FIXES.parts(fix))
        return True, neurons if edits else None, True
    return False, NeuronSource.parse(fix), True


def probe_config(cfg: ProbeRunConfig) -> Any:
    """The probe-training settings (:class:`~vitreg.probe.linear.FitSettings`) of a run config."""
    from vitreg.probe.linear import FitSettings

    return FitSettings(seeds=tuple(range(cfg.seeds)), epochs=cfg.epochs, optimizer=cfg.optimizer)


def probe_fix(
    model: Any,
    spec: str,
    neurons: NeuronSource | None,
    cfg: ProbeRunConfig,
    progress: Progress,
    notices: Notices,
    preloaded: Any = None,
) -> Any:
    """The fix: ``cfg.fix``'s method (``naclip``, ``ttr+naclip``, ...), else TestTimeRegisters;
    register neurons from a NeuronSet file (``preloaded`` if read already), the built-in set,
    or discovery (with the defaults of `vitreg neurons`), when the fix edits them."""
    from vitreg.fix import TestTimeRegisters
    from vitreg.fix.methods import FIXES, FixInputs, is_entry

    method = cfg.fix if is_entry(cfg.fix) else None
    parts = FIXES.parts(method) if method else []
    needs_data = any(m.needs_images for m in parts)
    source = None
    if (neurons is not None and neurons.kind == "discover") or needs_data:
        source = image_source(model, spec, None, False, None, cfg.batch_size, notices)
    chosen = None
    if neurons is not None:
        search = NeuronsConfig(batch_size=cfg.batch_size)
        chosen, _, _ = load_neurons(
            model, spec, neurons, source, search, progress, notices, preloaded
        )
    if method is None:
        return TestTimeRegisters.from_settings(chosen, cfg)
    inputs = FixInputs(model, chosen, source, cfg.batch_size, cfg.ttr_args())
    return FIXES.build(method, inputs)


@session()  # the --out claimed inside is released when the verb ends
def run_probe(
    cfg: ProbeRunConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> ProbeRun:
    """Probe ``cfg``'s model on its task and data and write the run directory."""
    from vitreg.distributed import is_main
    from vitreg.probe.run import run, splits

    notices = Notices(on_notice)
    cfg, command = prepare(cfg, notices)
    spec, run_dir = cfg.spec, cfg.out
    base, neuron_source, fixed = fix_plan(cfg.fix, cfg.neurons)
    # a missing or bad neuron file fails before the model loads
    preloaded = None if neuron_source is None else neuron_file(neuron_source, spec)
    datasets = splits(cfg.data)
    device = join_torchrun(cfg.device)
    model = load_model(spec, cfg.random_init, cfg.img_size, device, cfg.weights, progress, notices)
    fix = None
    if fixed:
        fix = probe_fix(model, spec, neuron_source, cfg, progress, notices, preloaded)
    result = run(
        model,
        cfg.task,
        datasets,
        fix=fix,
        base=base,
        layers=parse_layers(cfg.layers),
        cache_dir=cfg.cache,
        config=probe_config(cfg),
        batch_size=cfg.batch_size,
        templates=cfg.templates,
        image_size=cfg.img_size,
        task_options={"pamr_steps": cfg.pamr, "protocol": cfg.protocol},
        progress=progress,
    )
    typed = result.results
    document = None
    if is_main():
        from vitreg.report.renderers.probe import write_probe_run
        from vitreg.report.renderers.probe_figures import probe_figures
        from vitreg.report.writer import as_json

        with progress(None, "writing the report"):
            draw = lambda: probe_figures(result)  # noqa: E731  (after metrics.json)
            described = model_info(result.model)
            document = as_json(write_probe_run(run_dir, typed, described, cfg, command, draw))
    return ProbeRun(
        "probe", run_dir, document, notices.items, probe=typed, verdict=verdict_of(typed)
    )


def verdict_of(results: ProbeResults) -> str:
    """The run (its typed results) in one sentence, as its report says it."""
    from vitreg.report.renderers.probe import verdict

    return verdict(results)


VERB = register(
    Verb(
        config=ProbeRunConfig,
        run=run_probe,
        help="Linear probes on frozen tokens, with and without test-time registers.",
        results=ProbeResults,
        renderer="vitreg.report.renderers.probe",
        argument=("spec",),
    )
)
