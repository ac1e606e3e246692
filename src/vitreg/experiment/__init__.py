"""Controlled experiments: the [CLS]/patch-specialisation variant grid, trained, probed, compared."""

from vitreg.core.renamed import renamed
from vitreg.experiment.grid import SIZES, finetune_variants, grid, preset
from vitreg.experiment.variants import ExperimentResult, run_variants
from vitreg.results.experiment import ExperimentSettings, Variant

__all__ = [
    "SIZES",
    "ExperimentResult",
    "ExperimentSettings",
    "Variant",
    "finetune_variants",
    "grid",
    "preset",
    "run_variants",
]

__getattr__ = renamed(__name__, {"Settings": "ExperimentSettings"}, globals())
