"""The neurons verb: find register neurons on the chosen images (discovery, a causal check, top-k
calibrated on held-out images) and save them with a report, as ``vitreg neurons`` does."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitreg.configs import NeuronsConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.results.neurons import NeuronsResults
from vitreg.results.schema import Envelope, model_info
from vitreg.verbs.common import images_named, join_torchrun, prepare
from vitreg.verbs.loading import check_images, model_and_images
from vitreg.verbs.neuron_sources import planted_rows, search_neurons
from vitreg.verbs.result import Listener, NeuronsRun, Notices
from vitreg.verbs.resume import checkpointed, finished

if TYPE_CHECKING:
    from vitreg.neurons.auto import NeuronSearchResult


@session()  # the --out claimed inside is released when the verb ends
def run_neurons(
    cfg: NeuronsConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> NeuronsRun:
    """Discover the register neurons of ``cfg``'s model and write the run directory
    (neurons.json + neurons.safetensors, metrics.json, then the report)."""
    from vitreg.distributed import on_main
    from vitreg.report.writer import as_json

    notices = Notices(on_notice)
    cfg, command = prepare(cfg, notices, demo=f"planted register neurons, on {images_named(cfg)}")
    check_images(cfg.images)
    model, source = model_and_images(cfg, join_torchrun(cfg.device), progress, notices)
    with checkpointed(cfg.out, cfg.checkpoint_every, cfg.to_file()):
        found = search_neurons(
            model,
            source,
            cfg,
            progress,
            notices,
            batch_size=cfg.batch_size,
            stability=cfg.stability,
            check_sizes=cfg.check_sizes,
        )
    document = on_main(write, cfg.out, model, source, found, cfg, command, progress)
    finished(cfg.out, cfg.checkpoint_every)
    written = None if document is None else as_json(document)
    return NeuronsRun("neurons", cfg.out, written, notices.items, found=found, spec=cfg.spec)


def write(
    run_dir: Path,
    model: Any,
    source: Any,
    found: NeuronSearchResult,
    cfg: NeuronsConfig,
    command: str,
    progress: Progress,
) -> Envelope:
    """The NeuronSet files, then metrics.json and the report; the typed document written."""
    from vitreg.report.renderers.neurons import write_neurons_run

    data = source.description().model_copy(update={"split": found.split})
    found.chosen.data = {**found.chosen.data, "images": source.label, "split": found.split}
    with progress(None, "writing the neuron set and the report"):
        (run_dir / "metrics.json").unlink(missing_ok=True)  # never beside a newer neuron set
        found.chosen.save(run_dir / "neurons")
        results = NeuronsResults(
            **dict(found),
            planted=planted_rows(model, found.chosen.pairs()),
            files={"json": "neurons.json", "tensors": "neurons.safetensors"},
        )
        document = write_neurons_run(
            run_dir,
            described=model_info(model.describe()),
            data=data,
            config=cfg,
            results=results,
            command=command,
        )
        if cfg.hub_dir:
            from vitreg.neurons import hub

            meta = hub.run_metadata(found, model, source.label, data.n_images)
            hub.write_folder(found.chosen, cfg.hub_dir, meta)
    return document


VERB = register(
    Verb(
        config=NeuronsConfig,
        run=run_neurons,
        help="Find register neurons: discovery, a causal check and the fix checked on held-out images.",
        results=NeuronsResults,
        renderer="vitreg.report.renderers.neurons",
        argument=("spec",),
    )
)
