"""Training-free fixes: test-time registers, the attention-bias substitute, causal controls."""

from vitreg.fix.attention_bias import AttentionBiasSubstitute
from vitreg.fix.compare import compare_fix
from vitreg.fix.controls import ablate, random_like, shift_to_patch
from vitreg.fix.test_time_registers import TestTimeRegisters

__all__ = [
    "AttentionBiasSubstitute",
    "TestTimeRegisters",
    "ablate",
    "compare_fix",
    "random_like",
    "shift_to_patch",
]
