"""Register neurons: the automatic path, discovery, causal selection, calibration, NeuronSet
files, published sets."""

from vitreg.neurons.auto import Found, find_neurons
from vitreg.neurons.builtin import builtin_neurons
from vitreg.neurons.calibrate import calibrate_top_k
from vitreg.neurons.discover import discover
from vitreg.neurons.neuron_set import NeuronSet

__all__ = ["Found", "NeuronSet", "builtin_neurons", "calibrate_top_k", "discover", "find_neurons"]
