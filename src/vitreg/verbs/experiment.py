"""The experiment verb: train, probe and diagnose the ViT variant grid and write one comparison
report, as ``vitreg experiment variants`` does."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from vitreg.configs import ExperimentConfig
from vitreg.core.run_dir import session
from vitreg.core.verb import Verb, register
from vitreg.progress import SILENT, Progress
from vitreg.results.experiment import ExperimentResults
from vitreg.verbs.common import default_run_dir
from vitreg.verbs.result import ExperimentRun, Listener, Notice, Notices

if TYPE_CHECKING:
    from vitreg.experiment import ExperimentSettings, Variant


class ExperimentArgs(TypedDict):
    """The keyword arguments of :func:`vitreg.experiment.run_variants` that a config sets."""

    settings: ExperimentSettings
    variants: Sequence[Variant]
    finetune: str | None
    pretrained: bool


def _threads(threads: int | None, size: str, device_is_cpu: bool) -> int | None:
    """Torch threads: 1 for the tiny preset on CPU (its small ops do not scale; measured 2-4x
    faster on a 2-core machine), else the given count or torch's default."""
    if threads is not None:
        return threads
    return 1 if size == "tiny" and device_is_cpu else None


def resolved(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with the machine-dependent defaults filled in (size, threads, run directory), so
    that its config.yaml reruns the same experiment elsewhere."""
    import torch

    cpu = not torch.cuda.is_available()
    size = cfg.size or ("tiny" if cpu else "small")
    run_dir = cfg.out if cfg.out is not None else default_run_dir("variants", verb="experiment")
    return cfg.model_copy(
        update={"size": size, "threads": _threads(cfg.threads, size, cpu), "out": run_dir}
    )


def experiment_args(cfg: ExperimentConfig) -> ExperimentArgs:
    """The arguments of :func:`vitreg.experiment.run_variants` (after data and out) that a
    resolved :class:`~vitreg.configs.ExperimentConfig` sets."""
    from vitreg.experiment import grid, preset

    settings = preset(
        cfg.size,
        steps=cfg.steps,
        recipe=cfg.recipe,
        seeds=cfg.seeds,
        batch_size=cfg.batch_size,
    )
    return {
        "settings": settings,
        "variants": grid(include_gap=cfg.include_gap),
        "finetune": cfg.finetune,
        "pretrained": cfg.pretrained,
    }


def experiment_command_line(cfg: ExperimentConfig) -> str:
    """The command line that reproduces the run of a resolved ``cfg``."""
    parts = ["vitreg", "experiment", "variants", "--data", cfg.data]
    shown = {k: getattr(cfg, k) for k in ("out", "size", "steps", "recipe", "seeds")}
    shown |= {"batch-size": cfg.batch_size, "threads": cfg.threads}
    parts += [f"--{k}={v}" for k, v in shown.items() if v is not None]
    parts += [] if cfg.include_gap else ["--no-gap"]
    parts += [f"--finetune={cfg.finetune}"] if cfg.finetune else []
    parts += ["--pretrained"] if cfg.pretrained else []
    return shlex.join(parts)


@session()  # the --out claimed inside is released when the verb ends
def run_experiment(
    cfg: ExperimentConfig, progress: Progress = SILENT, on_notice: Listener | None = None
) -> ExperimentRun:
    """Run the variant grid of ``cfg`` and write the experiment folder (its log lines are
    notices)."""
    import torch

    from vitreg.core.out_dir import check_out
    from vitreg.experiment import run_variants

    cfg = resolved(cfg)
    check_out(cfg.out, "experiment", None, cfg.overwrite)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    notices = Notices(on_notice)
    t0 = time.perf_counter()
    result = run_variants(
        cfg.data,
        cfg.out,
        **experiment_args(cfg),
        log=lambda line: notices.append(Notice("log", line)),
        progress=progress,
        command=experiment_command_line(cfg),
        config=cfg.to_file(),
    )
    seconds = time.perf_counter() - t0
    return ExperimentRun(
        "experiment", cfg.out, result.document, notices.items, experiment=result, seconds=seconds
    )


VERB = register(
    Verb(
        config=ExperimentConfig,
        run=run_experiment,
        help="""Train baseline, +norm/LS and +early-QKV ViTs x {none, registers, attention bias}
    (and the GAP baseline), probe and diagnose each, and write one comparison report.""",
        results=ExperimentResults,
        renderer="vitreg.experiment.report",
        resumes=True,
        flags={"include_gap": "--include-gap/--no-gap"},
        group="experiment",
        command="variants",
    )
)
