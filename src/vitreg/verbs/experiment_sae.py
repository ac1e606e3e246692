"""The SAE study verb: the same sparse autoencoder trained on a model's raw activations, on them
with the outlier tokens left out, and on the activations of the model fixed with test-time
registers, as ``vitreg experiment sae`` does."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitreg.configs import SaeConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.errors import InputError
from vitreg.progress import SILENT, Progress
from vitreg.results.sae import SaeResults
from vitreg.results.schema import Envelope, model_info
from vitreg.settings.sae import SaeSettings
from vitreg.verbs.common import images_named, prepare
from vitreg.verbs.loading import check_images, model_and_images
from vitreg.verbs.neuron_sources import load_neurons, neuron_file
from vitreg.verbs.result import Listener, Notices, VerbResult


@dataclass
class SaeRun(VerbResult):
    """``experiment sae``: the typed results of the study, as metrics.json holds them, and its
    summary in a few lines (each arm's headline measures)."""

    results: SaeResults | None = None
    lines: list[str] = field(default_factory=list)


def sae_settings(cfg: SaeConfig) -> SaeSettings:
    """The SAE recipe part of ``cfg``, whole."""
    return SaeSettings.model_validate(
        {name: getattr(cfg, name) for name in SaeSettings.model_fields}
    )


def check_model(model: Any, spec: str) -> None:
    """A model with no test-time registers applied yet (the raw arm needs the original)."""
    if model.layout.n_extra:
        raise InputError(
            f"{spec} is loaded with test-time registers already applied (a model saved by "
            "`vitreg fix --save`), so it has no raw activations to compare; run `vitreg "
            "experiment sae` on the original model"
        )


@session()  # the --out claimed inside is released when the verb ends
def run_sae(
    cfg: SaeConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> SaeRun:
    """Trace the raw and the fixed model on ``cfg``'s images, train the three arms' SAEs over
    the seeds and write the run directory."""
    from vitreg.experiment.sae import MIN_IMAGES, sae_study
    from vitreg.experiment.sae_data import gather
    from vitreg.fix import TestTimeRegisters

    notices = Notices(on_notice)
    cfg, command = prepare(cfg, notices, demo=f"planted register neurons, on {images_named(cfg)}")
    command = "vitreg experiment " + command.removeprefix("vitreg ")  # a command of the group
    if cfg.limit is not None and cfg.limit < MIN_IMAGES:  # before any model loads
        raise InputError(
            f"--limit {cfg.limit}: the SAE study needs at least {MIN_IMAGES} images (some to "
            "train on, some held out)"
        )
    preloaded = neuron_file(cfg.neurons, cfg.spec)  # a missing or bad file fails before the model
    check_images(cfg.images)
    model, source = model_and_images(cfg, cfg.device, progress, notices)
    check_model(model, cfg.spec)
    chosen, info, _ = load_neurons(
        model, cfg.spec, cfg.neurons, source, cfg, progress, notices, preloaded
    )
    ttr = TestTimeRegisters.from_settings(chosen, cfg)
    with progress(None, "tracing the raw and the fixed model"):
        acts = gather(model, source, cfg.layer, ttr, cfg.batch_size)
    results = sae_study(acts, sae_settings(cfg), info, progress, device=cfg.device)
    doc = write(cfg.out, model, source, results, cfg, command, progress)
    from vitreg.report.renderers.sae import console_lines
    from vitreg.report.writer import as_json

    lines = console_lines(results)
    return SaeRun("sae", cfg.out, as_json(doc), notices.items, results=results, lines=lines)


def write(
    run_dir: Path,
    model: Any,
    source: Any,
    results: SaeResults,
    cfg: SaeConfig,
    command: str,
    progress: Progress,
) -> Envelope:
    """config.yaml, the report and metrics.json of one study; the typed document written."""
    from vitreg.report.renderers.sae import write_sae_run

    with progress(None, "writing the report"):
        return write_sae_run(
            run_dir,
            results,
            described=model_info(model.describe()),
            data=source.description(),
            config=cfg,
            command=command,
        )


VERB = register(
    Verb(
        config=SaeConfig,
        run=run_sae,
        help="""Train the same small TopK SAE on raw activations, on them with the outlier tokens
    left out, and on the model fixed with test-time registers, and report side by side: error
    on ordinary patches, dead latents, outlier latents and the loss share on outlier tokens.""",
        results=SaeResults,
        renderer="vitreg.report.renderers.sae",
        argument=("spec",),
        group="experiment",
        command="sae",
    )
)
