"""A model saved with its test-time-register fix: ``save_fixed`` writes a ``local:`` folder whose
``config.json`` has a ``vitreg_fix`` section, which this module registers with the ``local:``
loader so that loading the folder re-applies the fix."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vitreg.core.io import write_text_atomic
from vitreg.errors import InputError
from vitreg.fix.neuron_set import NeuronSet
from vitreg.fix.test_time_registers import TestTimeRegisters
from vitreg.models.load import contained, inside
from vitreg.models.loaders.local import SECTIONS, ConfigSection, save_local
from vitreg.models.model import Model


class FixOptions(BaseModel):
    """The TestTimeRegisters options of a saved fix."""

    model_config = ConfigDict(extra="forbid", strict=True)

    n_registers: int = Field(1, ge=1, le=64)
    cls: str = "zero"
    patches: str = "zero"
    mode: str = "paper"
    seed: int = 0
    scale: float = Field(1.0, allow_inf_nan=False)


class FixSection(BaseModel):
    """``vitreg_fix``: the neuron set (a path inside the folder) and the fix's options."""

    model_config = ConfigDict(extra="forbid", strict=True)

    method: Literal["test_time_registers"]
    neurons: str = Field(min_length=1)
    n_neurons: int = Field(ge=0)
    options: FixOptions = Field(default_factory=FixOptions)


def prepare(
    directory: Path, config_path: Path, fix: FixSection
) -> tuple[str, Callable[[Model], None]]:
    """The saved fix's neuron set (both files inside the folder) checked, and its setup."""
    base = contained(directory, fix.neurons, "vitreg_fix.neurons", config_path)
    for path in NeuronSet.files(base):
        if path.exists() or path.is_symlink():
            inside(directory, path, "vitreg_fix.neurons", config_path)
    neurons = NeuronSet.load(base)
    if len(neurons) != fix.n_neurons:
        raise InputError(
            f"model config {str(config_path)!r}: vitreg_fix.n_neurons is {fix.n_neurons} but the "
            f"neuron set {fix.neurons!r} holds {len(neurons)}; the folder was edited or is "
            "incomplete (save it again with `vitreg fix --save`)"
        )
    options = fix.options.model_dump()
    note = (
        f"test-time registers from {str(directory)!r} applied ({len(neurons)} neurons); "
        "timm's own API loads the same weights without the fix"
    )

    def apply(model: Model) -> None:
        neurons.check_applicable(model, where=f"the saved fix in {str(config_path)!r}")
        TestTimeRegisters(neurons, **options).apply(model)

    return note, apply


def save_fixed(
    model: Model, ttr: TestTimeRegisters, directory: str | os.PathLike, **model_args: Any
) -> Path:
    """Save a timm model with its test-time-register fix; ``local:DIR`` loads it fixed.

    The weights are the untouched source weights (timm's own API loads them as the bare model);
    ``config.json`` names the neuron set and the fix options, which vitreg re-applies on load.
    """
    out = save_local(model.module, directory, **model_args)
    ttr.neurons.save(out / "neurons")
    settings = ttr.settings()
    options = {
        k: getattr(settings, k) for k in ("n_registers", "cls", "patches", "mode", "seed", "scale")
    }
    config = json.loads((out / "config.json").read_text())
    config["vitreg_fix"] = {
        "method": "test_time_registers",
        "neurons": "neurons",
        "n_neurons": len(ttr.neurons),
        "options": options,
    }
    write_text_atomic(out / "config.json", json.dumps(config, indent=2))
    return out


SECTIONS.register("vitreg_fix", ConfigSection(FixSection, prepare))
