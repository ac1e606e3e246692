"""Where register neurons come from and how they are searched for."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, PositiveInt, field_validator
from pydantic_core import core_schema

from vitreg.settings.base import SettingsPart, Threshold


class NeuronSource(str):
    """Where a verb's register neurons come from, spelled as on the command line: ``discover``
    (find them first on the run's images, as ``vitreg neurons`` does), ``builtin`` (the
    published set for the model), ``hf:ORG/REPO[@REVISION]`` (a set on the Hugging Face hub)
    or the path of a NeuronSet file (its ``.json``, or the stem).

    :attr:`kind` is what the verbs dispatch on (``vitreg.verbs.neuron_sources.READERS`` reads
    each kind but discovery); a new kind is a spelling recognised in :meth:`parse` and
    :attr:`kind` plus a reader there. ``None`` and ``auto``
    (how earlier config.yaml files and ``vitreg vlm --neurons auto`` said it) read as
    ``discover``."""

    WORDS: ClassVar[tuple[str, ...]] = ("discover", "builtin")
    HUB: ClassVar[str] = "hf:"  # vitreg.neurons.hub.PREFIX

    @property
    def kind(self) -> str:
        """``discover``, ``builtin``, ``hub`` or ``file``."""
        if self in self.WORDS:
            return str(self)
        return "hub" if self.startswith(self.HUB) else "file"

    @classmethod
    def parse(cls, value: object) -> NeuronSource:
        """The source ``value`` names (a string, or ``None``/``"auto"`` for discovery)."""
        if value is None or value == "auto":
            return cls("discover")
        if isinstance(value, Path):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise ValueError("name a NeuronSet file, builtin, hf:ORG/REPO or discover")
        return cls(value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse,
            json_schema_input_schema=core_schema.str_schema(),
            serialization=core_schema.to_string_ser_schema(),
        )


DISCOVER = NeuronSource("discover")


class NeuronSearch(SettingsPart):
    """How register neurons are found (``vitreg neurons``, and the verbs that discover first)."""

    target: float = Field(
        0.01,
        ge=0.0,
        le=1.0,
        description="Held-out patch outlier rate the fix must also reach (besides no outlier "
        "mode), where the detection threshold lies above the ordinary patches' tolerance band.",
    )
    top_k: Literal["auto"] | PositiveInt = Field(
        "auto",
        description="'auto': the causal units, the smallest k whose fix leaves no artifacts on "
        "held-out images; or a number of neurons (the paper's top-k ranking).",
    )
    detect_layer: int | None = Field(
        None,
        description="Block whose output defines outliers (default: the cleanest outlier mode).",
    )
    highest_layer: int | None = Field(
        None,
        description="Last block searched for neurons (default: the last block where the "
        "outliers still grow, up to the detection layer).",
    )
    threshold: Threshold = Field(
        "auto",
        description="Outlier rule: auto (valley of the norm histogram), mean3std, robust, or a "
        "norm.",
    )

    @field_validator("threshold")
    @classmethod
    def _positive(cls, v: Threshold) -> Threshold:
        if isinstance(v, float) and not (math.isfinite(v) and v > 0):
            raise ValueError(f"a numeric threshold must be a positive norm, got {v}")
        return v


class NeuronChoice(SettingsPart):
    """Which register neurons a fix uses."""

    neurons: NeuronSource = Field(
        DISCOVER,
        description="Where the register neurons come from: a NeuronSet file (neurons.json from "
        "`vitreg neurons`), builtin (the published set for SPEC), hf:ORG/REPO[@REVISION] (a set "
        "on the Hugging Face hub), or discover (find them first on these images, as "
        "`vitreg neurons` does).",
    )
