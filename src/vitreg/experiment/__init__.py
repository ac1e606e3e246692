"""Controlled experiments: the [CLS]/patch-specialisation variant grid, trained, probed, compared."""

from vitreg.experiment.grid import SIZES, Settings, Variant, finetune_variants, grid, preset
from vitreg.experiment.variants import ExperimentResult, run_variants

__all__ = [
    "SIZES",
    "ExperimentResult",
    "Settings",
    "Variant",
    "finetune_variants",
    "grid",
    "preset",
    "run_variants",
]
