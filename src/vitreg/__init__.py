"""vitreg: diagnose, fix and avoid token artifacts in Vision Transformers.

The public names load lazily (PEP 562), so ``import vitreg`` and ``vitreg --help`` import neither
torch nor timm; the registries of lower layers that higher packages fill (the ``planted:``
loader, a saved fix's ``local:`` section, the ``vitreg_*`` timm names) are filled when first read.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from vitreg.arch.autoregister import install as _install_timm_names
from vitreg.core.plugins import provide as _provide
from vitreg.core.renamed import moved as _moved
from vitreg.core.version import __version__

if TYPE_CHECKING:  # what the lazy names are, for type checkers and readers
    from vitreg.analysis.diagnose import diagnose
    from vitreg.core.layout import TokenLayout
    from vitreg.errors import (
        HookError,
        InputError,
        SpecError,
        UnsupportedModelError,
        VitregError,
        WeightsError,
    )
    from vitreg.fix.neuron_set import NeuronSet
    from vitreg.fix.test_time_registers import TestTimeRegisters
    from vitreg.hooks import (
        ActivationCache,
        Histogram,
        HookContext,
        Max,
        Mean,
        TokenNorms,
        TopK,
        hook_name,
    )
    from vitreg.models.load import load
    from vitreg.models.model import Model, TraceResult
    from vitreg.models.wrapping import wrap
    from vitreg.neurons.auto import find_neurons
    from vitreg.verbs import run

_EXPORTS = {
    "diagnose": "vitreg.analysis.diagnose",
    "TokenLayout": "vitreg.core.layout",
    **dict.fromkeys(
        (
            "HookError",
            "InputError",
            "SpecError",
            "UnsupportedModelError",
            "VitregError",
            "WeightsError",
        ),
        "vitreg.errors",
    ),
    "NeuronSet": "vitreg.fix.neuron_set",
    "TestTimeRegisters": "vitreg.fix.test_time_registers",
    **dict.fromkeys(
        ("ActivationCache", "Histogram", "HookContext", "Max", "Mean", "TokenNorms", "TopK"),
        "vitreg.hooks",
    ),
    "hook_name": "vitreg.hooks",
    "load": "vitreg.models.load",
    "wrap": "vitreg.models.wrapping",
    "Model": "vitreg.models.model",
    "TraceResult": "vitreg.models.model",
    "find_neurons": "vitreg.neurons.auto",
    "run": "vitreg.verbs",
}

# packages that fill the registries of lower layers, imported when the registry is first read:
# the planted: specs (model loaders), a local: folder's saved fix (config.json's vitreg_fix) and
# the verbs
_provide("loaders", "vitreg.testing.loader")
_provide("local_sections", "vitreg.fix.saved")
_provide("verbs", "vitreg.verbs")  # every verb's record, registered beside its code
_install_timm_names()  # the vitreg_* timm model names, registered once timm is imported
# modules that moved: their old names import the new modules, with a DeprecationWarning
_moved(
    {
        "vitreg.report.results": "vitreg.results",
        "vitreg.report.schema": "vitreg.results.schema",
        "vitreg.report.upgrade": "vitreg.results.upgrade",
        "vitreg.report.verbs": "vitreg.report.renderers",
        "vitreg.report.out_dir": "vitreg.core.out_dir",
        "vitreg.train.schedule": "vitreg.core.schedule",
        "vitreg.train.settings": "vitreg.settings.train",
        "vitreg.probe.zero_shot.base": "vitreg.probe.tasks.model_task",
        "vitreg.verbs.fix_board": "vitreg.verbs.leaderboard",
        "vitreg.report.renderers.fix_board": "vitreg.report.renderers.leaderboard",
        "vitreg.results.board": "vitreg.results.leaderboard",
    }
)

__all__ = [
    "ActivationCache",
    "Histogram",
    "HookContext",
    "HookError",
    "InputError",
    "Max",
    "Mean",
    "Model",
    "NeuronSet",
    "SpecError",
    "TestTimeRegisters",
    "TokenLayout",
    "TokenNorms",
    "TopK",
    "TraceResult",
    "UnsupportedModelError",
    "VitregError",
    "WeightsError",
    "__version__",
    "diagnose",
    "find_neurons",
    "hook_name",
    "load",
    "run",
    "wrap",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        # a subpackage (vitreg.probe, vitreg.testing, ...): imported on first use, as before
        if name.startswith("_") or importlib.util.find_spec(f"vitreg.{name}") is None:
            raise AttributeError(f"module 'vitreg' has no attribute {name!r}")
        return importlib.import_module(f"vitreg.{name}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
