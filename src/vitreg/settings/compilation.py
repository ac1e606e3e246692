"""Whether a verb's traced forward runs through ``torch.compile``."""

from __future__ import annotations

from pydantic import Field

from vitreg.settings.base import SettingsPart


class Compilation(SettingsPart):
    """The compiled forward (:meth:`vitreg.Model.compile`, inductor backend): off by default,
    as on a CPU it does not pay."""

    compile: bool = Field(
        False,
        description="Run the traced forward through torch.compile (inductor; hooks run eagerly "
        "between the compiled pieces; the first batches pay the compile time). Off by default: "
        "on a CPU it does not pay.",
    )
