"""Planted-artifact ViTs: real architectures with seeded random weights and known register neurons.

``build(name)`` returns any fixture by name and its ground truth; the modules behind it:

* :mod:`.truth`: the outlier rules (:class:`FlatRule`, :class:`PositionRule`) and
  :class:`GroundTruth`;
* :mod:`.planted`: the timm fixtures of ``SPECS`` (one planted layer and its readers);
* :mod:`.planted_circuits`: role-annotated fixtures (multi-block causes, readers, distractors);
* :mod:`.planted_kinds`: one artifact kind each (sinks, massive activations, registers);
* :mod:`.planted_hf`, :mod:`.planted_vlm`: the HF CLIP tower and a tiny LLaVA around it;
* :mod:`.plant_family`, :mod:`.plant_check`: a seeded random family of circuits and its check;
* :mod:`.catalog`: every fixture by name; ``_weights``: the weight edits they share.
"""

from vitreg.testing.planted.catalog import build, list_planted
from vitreg.testing.planted.plant_check import CircuitCheck, check_circuit
from vitreg.testing.planted.plant_family import (
    ARCHS,
    FEATURED,
    RULES,
    random_circuit,
    random_unplanted,
    sample,
)
from vitreg.testing.planted.planted import SPECS, build_timm, build_unplanted
from vitreg.testing.planted.planted_circuits import MODE_RATIO, Options, build_circuit
from vitreg.testing.planted.planted_hf import HF_FIXTURES, build_hf, clip_vision_from_timm
from vitreg.testing.planted.planted_kinds import (
    CLS_MARK,
    KINDS,
    POSITION_VALUE,
    KindTruth,
    PlantedSink,
    build_kind,
)
from vitreg.testing.planted.planted_vlm import build_tiny_llava, save_tiny_llava
from vitreg.testing.planted.truth import FlatRule, GroundTruth, PositionRule, texture_filters

__all__ = [
    "ARCHS",
    "CLS_MARK",
    "FEATURED",
    "HF_FIXTURES",
    "KINDS",
    "MODE_RATIO",
    "POSITION_VALUE",
    "RULES",
    "SPECS",
    "CircuitCheck",
    "FlatRule",
    "GroundTruth",
    "KindTruth",
    "Options",
    "PlantedSink",
    "PositionRule",
    "build",
    "build_circuit",
    "build_hf",
    "build_kind",
    "build_timm",
    "build_tiny_llava",
    "build_unplanted",
    "check_circuit",
    "clip_vision_from_timm",
    "list_planted",
    "random_circuit",
    "random_unplanted",
    "sample",
    "save_tiny_llava",
    "texture_filters",
]
