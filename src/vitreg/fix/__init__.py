"""Training-free fixes: the NeuronSet they edit, test-time registers (also saved with a model),
the attention-bias substitute, causal controls."""

from vitreg.fix.attention_bias import AttentionBiasSubstitute
from vitreg.fix.compare import compare_fix
from vitreg.fix.controls import ablate, random_like, shift_to_patch
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.saved import save_fixed
from vitreg.fix.test_time_registers import TestTimeRegisters

__all__ = [
    "AttentionBiasSubstitute",
    "NeuronSet",
    "TestTimeRegisters",
    "ablate",
    "compare_fix",
    "random_like",
    "save_fixed",
    "shift_to_patch",
]
