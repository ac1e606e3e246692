"""Shared by the vlm report tests: a saved tiny planted LLaVA and its ground-truth neurons."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import vitreg
from vitreg.fix.neuron_set import NeuronSet
from vitreg.testing.planted import save_tiny_llava


def tiny_llava_with_truth(folder: Path) -> tuple[str, str]:
    """Save a tiny planted LLaVA (64 px) under ``folder``; its spec and the path of its
    ground-truth register neurons saved as a NeuronSet."""
    llava = save_tiny_llava(folder / "llava", img_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tower = vitreg.load(f"hf-vlm:{llava}")
    units = json.loads((llava / "vitreg_planted.json").read_text())["ground_truth"]["units"]
    return f"hf-vlm:{llava}", str(NeuronSet.from_pairs(units, tower).save(folder / "truth"))
