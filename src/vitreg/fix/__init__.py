"""Training-free fixes: the NeuronSet they edit, test-time registers (also saved with a model),
the attention-bias substitute, causal controls, the CLIP last-block methods (ClearCLIP, SCLIP,
NACLIP, SC-CLIP) and the registry that names them all (``FIXES``)."""

from vitreg.fix.attention_bias import AttentionBiasSubstitute
from vitreg.fix.clearclip import ClearCLIP
from vitreg.fix.compare import compare_fix
from vitreg.fix.composed import ComposedFix
from vitreg.fix.controls import ablate, random_like, shift_to_patch
from vitreg.fix.methods import FIXES, FixInputs
from vitreg.fix.naclip import NACLIP
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.saved import save_fixed
from vitreg.fix.sc_clip import SCCLIP
from vitreg.fix.sclip import SCLIP
from vitreg.fix.test_time_registers import TestTimeRegisters

__all__ = [
    "FIXES",
    "NACLIP",
    "SCCLIP",
    "SCLIP",
    "AttentionBiasSubstitute",
    "ClearCLIP",
    "ComposedFix",
    "FixInputs",
    "NeuronSet",
    "TestTimeRegisters",
    "ablate",
    "compare_fix",
    "random_like",
    "save_fixed",
    "shift_to_patch",
]
