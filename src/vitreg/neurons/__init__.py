"""Register neurons: discovery, top-k calibration, NeuronSet files, published sets."""

from vitreg.neurons.builtin import builtin_neurons
from vitreg.neurons.calibrate import calibrate_top_k
from vitreg.neurons.discover import discover
from vitreg.neurons.neuron_set import NeuronSet

__all__ = ["NeuronSet", "builtin_neurons", "calibrate_top_k", "discover"]
