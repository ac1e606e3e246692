"""How test-time registers edit a model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vitreg.settings.base import SettingsPart


class TtrSettings(SettingsPart):
    """How test-time registers edit the model (``vitreg.fix.TestTimeRegisters``)."""

    registers: int = Field(
        1, gt=0, le=256, description="Test-time registers to insert (the paper uses 1)."
    )
    cls: Literal["zero", "keep"] = Field(
        "zero", description="Register neurons on [CLS]: zero or keep."
    )
    patches: Literal["zero", "mean", "keep"] = Field(
        "zero", description="Register neurons on patches: zero, mean or keep."
    )
    mode: Literal["paper", "reference"] = Field(
        "paper",
        description="paper (per-neuron max, Algorithm 2) or reference (the official code's edit).",
    )

    def ttr_args(self) -> dict[str, int | str]:
        """The keyword arguments of ``TestTimeRegisters`` after the neurons (a fix built from
        settings takes them whole: ``TestTimeRegisters.from_settings``)."""
        return {
            "n_registers": self.registers,
            "cls": self.cls,
            "patches": self.patches,
            "mode": self.mode,
        }
