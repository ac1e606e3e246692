"""One library call per command: each verb takes its typed config (:mod:`vitreg.configs`) and an
optional :class:`~vitreg.progress.Progress`, writes the run directory exactly as the command
does, and returns a small typed result. The CLI parses options into the config, calls the verb
and prints the result; :func:`run` picks the verb from the config's type."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vitreg.progress import SILENT, Progress

if TYPE_CHECKING:
    from vitreg.configs import RunConfig
    from vitreg.verbs.diagnose import run_diagnose
    from vitreg.verbs.experiment import run_experiment
    from vitreg.verbs.fix import run_fix
    from vitreg.verbs.neurons import run_neurons
    from vitreg.verbs.probe import run_probe
    from vitreg.verbs.result import (
        DiagnoseRun,
        ExperimentRun,
        FixRun,
        Interrupted,
        Listener,
        NeuronsRun,
        Notice,
        ProbeRun,
        TrainRun,
        VerbResult,
        VlmRun,
    )
    from vitreg.verbs.train import run_train
    from vitreg.verbs.vlm import run_vlm

# verb -> its module; each module's run_<verb> is the verb (loaded when first used, so that the
# CLI's --help imports no torch)
_VERB_MODULES = {
    v: f"vitreg.verbs.{v}"
    for v in ("diagnose", "neurons", "fix", "probe", "train", "experiment", "vlm")
}
_EXPORTS = {
    **{f"run_{v}": m for v, m in _VERB_MODULES.items()},
    **dict.fromkeys(
        (
            "DiagnoseRun",
            "ExperimentRun",
            "FixRun",
            "Interrupted",
            "Listener",
            "NeuronsRun",
            "Notice",
            "ProbeRun",
            "TrainRun",
            "VerbResult",
            "VlmRun",
        ),
        "vitreg.verbs.result",
    ),
}


def __getattr__(name: str) -> Any:
    if name == "VERBS":  # verb -> its library call
        return {
            v: getattr(importlib.import_module(m), f"run_{v}") for v, m in _VERB_MODULES.items()
        }
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vitreg.verbs' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def run(config: RunConfig, progress: Progress = SILENT, on_notice: Listener | None = None) -> Any:
    """Run the verb of ``config`` (a typed config such as :class:`~vitreg.configs.FixConfig`):
    the run directory is written as ``vitreg <verb>`` writes it; returns the verb's result
    (``on_notice``, if given, also sees each notice as it happens)."""
    from vitreg.configs import RunConfig
    from vitreg.errors import InputError

    verbs = __getattr__("VERBS")
    verb = verbs.get(getattr(config, "verb", ""))
    if verb is None or not isinstance(config, RunConfig):
        raise InputError(
            f"vitreg.run takes a typed run config (one of {', '.join(sorted(verbs))}: "
            f"vitreg.configs.DiagnoseConfig, FixConfig, ...), got {type(config).__name__}"
        )
    return verb(config, progress, on_notice)


__all__ = [
    "VERBS",
    "DiagnoseRun",
    "ExperimentRun",
    "FixRun",
    "Interrupted",
    "Listener",
    "NeuronsRun",
    "Notice",
    "ProbeRun",
    "TrainRun",
    "VerbResult",
    "VlmRun",
    "run",
    "run_diagnose",
    "run_experiment",
    "run_fix",
    "run_neurons",
    "run_probe",
    "run_train",
    "run_vlm",
]
