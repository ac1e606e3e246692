"""The fix verb: test-time registers on a model, compared before and after on the chosen images
(neurons from a file, the built-in set, or discovered first), as ``vitreg fix`` does."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitreg.configs import FixConfig
from vitreg.core.readers import read_json
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.errors import InputError
from vitreg.progress import SILENT, Progress
from vitreg.results.fix import FixResults
from vitreg.results.schema import Envelope, model_info
from vitreg.verbs.common import images_named, join_torchrun, prepare
from vitreg.verbs.loading import check_images, model_and_images
from vitreg.verbs.neuron_sources import load_neurons, neuron_file, planted_rows
from vitreg.verbs.result import BoardRun, FixRun, Listener, Notices

if TYPE_CHECKING:
    from vitreg.fix.compare import FixComparison
    from vitreg.fix.test_time_registers import TestTimeRegisters


def save_args(model: Any, spec: str, img_size: int | None) -> dict[str, Any]:
    """Constructor arguments that rebuild this timm model (planted: its ground truth's)."""
    truth = getattr(model.module, "vitreg_planted", None)
    if truth is not None:
        return dict(truth.model_args)
    args: dict[str, Any] = {}
    if spec.startswith("local:"):
        config = Path(spec.removeprefix("local:")).expanduser() / "config.json"
        saved = read_json(config, "model config", max_bytes=4 * 2**20)
        model_args = saved.get("model_args") if isinstance(saved, dict) else None
        args.update(model_args if isinstance(model_args, dict) else {})
    if img_size:
        args["img_size"] = img_size
    return args


def compare(
    model: Any, neurons: Any, source: Any, cfg: FixConfig, progress: Progress
) -> tuple[TestTimeRegisters, FixComparison]:
    """The TestTimeRegisters of ``cfg`` and its before/after comparison on ``source``."""
    from vitreg.fix import TestTimeRegisters, compare_fix

    ttr = TestTimeRegisters.from_settings(neurons, cfg)
    comparison = compare_fix(model, ttr, source, batch_size=cfg.batch_size, progress=progress)
    return ttr, comparison


def _check_model(model: Any, spec: str, save: Path | None) -> None:
    """A model that can be compared before/after (and saved, if asked)."""
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


def run_fix(
    cfg: FixConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> FixRun | BoardRun:
    """``vitreg fix``: test-time registers with a before/after report, or with ``--method``
    other than ``ttr`` the leaderboard of every fix named."""
    if cfg.method != "ttr":
        from vitreg.verbs.leaderboard import run_leaderboard

        return run_leaderboard(cfg, progress, on_notice)
    return run_test_time_registers(cfg, progress, on_notice)


@session()  # the --out claimed inside is released when the verb ends
def run_test_time_registers(
    cfg: FixConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> FixRun:
    """Apply test-time registers to ``cfg``'s model, compare before/after and write the run
    directory (and the fixed model with ``save``)."""
    from vitreg.core.out_dir import check_out
    from vitreg.distributed import is_main, on_main
    from vitreg.report.renderers.fix import MAX_ROWS
    from vitreg.report.writer import as_json

    notices = Notices(on_notice)
    cfg, command = prepare(cfg, notices, demo=f"planted register neurons, on {images_named(cfg)}")
    spec, run_dir = cfg.spec, cfg.out
    if cfg.save is not None:  # --save is a run folder vitreg owns too
        check_out(cfg.save, "fix", spec, cfg.overwrite)
    preloaded = neuron_file(cfg.neurons, spec)  # a missing or bad file fails before the model
    check_images(cfg.images)
    device = join_torchrun(cfg.device)
    model, source = model_and_images(cfg, device, progress, notices, MAX_ROWS)
    _check_model(model, spec, cfg.save)
    chosen, info, found = load_neurons(
        model, spec, cfg.neurons, source, cfg, progress, notices, preloaded
    )
    ttr, comparison = compare(model, chosen, source, cfg, progress)
    if cfg.save is not None and is_main():
        from vitreg.fix.saved import save_fixed

        with progress(None, f"saving the fixed model to {cfg.save}"):
            save_fixed(model, ttr, cfg.save, **save_args(model, spec, cfg.img_size))
    results = FixResults(
        comparison=comparison.results,
        neurons=info,
        discovery=found,
        saved=None if cfg.save is None else str(cfg.save),
        planted=planted_rows(model, chosen.pairs()),
    )
    document = on_main(write, run_dir, model, source, comparison, results, cfg, command, progress)
    return FixRun(
        "fix",
        run_dir,
        None if document is None else as_json(document),
        notices.items,
        comparison=comparison,
        fix=ttr,
        saved=cfg.save,
    )


def write(
    run_dir: Path,
    model: Any,
    source: Any,
    comparison: FixComparison,
    results: FixResults,
    cfg: FixConfig,
    command: str,
    progress: Progress,
) -> Envelope:
    """config.yaml and metrics.json, then the report, of one fix; the typed document written."""
    from vitreg.report.renderers.fix import write_fix_run

    with progress(None, "writing the report"):
        return write_fix_run(
            run_dir,
            comparison,
            described=model_info(model.describe()),
            data=source.description(),
            config=cfg,
            results=results,
            command=command,
            images=source.display_images(),
        )


VERB = register(
    Verb(
        config=FixConfig,
        run=run_fix,
        help="Apply test-time registers and report before/after: norm maps, outlier rate, embeddings.",
        results=FixResults,
        renderer="vitreg.report.renderers.fix",
        argument=("spec",),
    )
)
