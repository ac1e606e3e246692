"""Register neurons: the automatic path, discovery, causal selection, calibration, NeuronSet
files, published sets."""

from vitreg.fix.neuron_set import NeuronSet
from vitreg.neurons.auto import NeuronSearchResult, find_neurons
from vitreg.neurons.builtin import builtin_neurons
from vitreg.neurons.calibrate import calibrate_top_k
from vitreg.neurons.discover import discover

__all__ = [
    "NeuronSearchResult",
    "NeuronSet",
    "builtin_neurons",
    "calibrate_top_k",
    "discover",
    "find_neurons",
]
