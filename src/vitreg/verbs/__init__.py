"""One library call per command: each verb takes its typed config (:mod:`vitreg.configs`) and an
optional :class:`~vitreg.progress.Progress`, writes the run directory exactly as the command
does, and returns a small typed result. The CLI parses options into the config, calls the verb
and prints the result; :func:`run` picks the verb from the config's type.

Each verb module registers its :class:`~vitreg.core.verb.Verb` record once (``register(Verb(...))``
beside its run function); importing this package imports every module in it, so the records are
the only list of verbs. ``run_<verb>`` and the result types are read from them."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from vitreg.core.verb import VERBS, Verb
from vitreg.progress import SILENT, Progress
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

if TYPE_CHECKING:
    from vitreg.configs import RunConfig

for _module in pkgutil.iter_modules(__path__):  # each verb module registers its record
    importlib.import_module(f"{__name__}.{_module.name}")


def verb_of(config: object) -> Verb:
    """The record of the verb whose config ``config`` is (``InputError`` for anything else)."""
    from vitreg.errors import InputError

    name = getattr(type(config), "verb", None)
    if isinstance(name, str) and name in VERBS and isinstance(config, VERBS[name].config):
        return VERBS[name]
    configs = ", ".join(v.config.__name__ for v in VERBS.values())
    raise InputError(
        f"vitreg.run takes a typed run config (one of vitreg.configs' {configs}), "
        f"got {type(config).__name__}"
    )


def run(config: RunConfig, progress: Progress = SILENT, on_notice: Listener | None = None) -> Any:
    """Run the verb of ``config`` (a typed config such as :class:`~vitreg.configs.FixConfig`):
    the run directory is written as ``vitreg <verb>`` writes it; returns the verb's result
    (``on_notice``, if given, also sees each notice as it happens)."""
    return verb_of(config).run(config, progress, on_notice)


def __getattr__(name: str) -> Any:
    """``run_<verb>``: the library call of each registered verb."""
    verb = name.removeprefix("run_")
    if name.startswith("run_") and verb in VERBS:
        return VERBS[verb].run
    raise AttributeError(f"module 'vitreg.verbs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *(f"run_{v}" for v in VERBS)})


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
    "Verb",
    "VerbResult",
    "VlmRun",
    "run",
    "verb_of",
]
