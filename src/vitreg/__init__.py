"""vitreg: diagnose, fix and avoid token artifacts in Vision Transformers."""

from vitreg.analysis.diagnose import diagnose
from vitreg.arch.autoregister import install as _install_timm_names
from vitreg.core.layout import TokenLayout
from vitreg.core.version import __version__
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
from vitreg.models.load import load, wrap
from vitreg.models.model import Model, TraceResult
from vitreg.neurons.auto import find_neurons
from vitreg.verbs import run

# packages that fill the model loaders' registries on import: a local: folder's saved fix
# (config.json's vitreg_fix) and the planted: specs
from vitreg.fix import saved as _saved_fix  # noqa: F401  # isort: skip
from vitreg.testing import loader as _planted  # noqa: F401  # isort: skip

_install_timm_names()  # the vitreg_* timm model names, registered once timm is imported

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
    "TokenLayout",
    "TestTimeRegisters",
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
